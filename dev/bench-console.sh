#!/usr/bin/env bash
# The console's numbers, one run, same broker and MariaDB (a measurement,
# not a test):
#   1. render time of the overview (/) and the dead-letter list (several
#      filters, a deep keyset page) with DEAD dead letters in the table and
#      12 partitions x 5 consumer groups with committed offsets (lag): server
#      time as curl sees it, median and p95 of RUNS requests after a warm-up;
#      target <= 200 ms;
#   2. bulk replay throughput, console vs CLI: PAIRS times (alternating
#      which goes first), REPLAY pending dead letters of a group of their own
#      replayed by `orderpipe dlq replay --yes`, and as many of another
#      group's by the console (dry-run page, confirm POST, progress page
#      polled every second, as it reloads itself in a browser, until done). Both are timed the same way, from
#      their own `dlq_replays` row (started_ms..finished_ms: written by the
#      same Tracker around the same replay code); the wall time as the
#      client sees it is shown too (the CLI's includes its process start and
#      its count, the console's the confirm request and up to 1 s of polling).
#      Medians of each side and their ratio; the CPU each side used, and
#      the console's CPU while idle (its background lag measurement).
#
#   dev/bench-console.sh [DEAD] [REPLAY] [RUNS] [PAIRS]   (defaults 100000 20000 20 3; needs `make dev-up`)
#   ORDERPIPE_BIN=target/debug/orderpipe dev/bench-console.sh   (a debug build: slower rendering)
set -euo pipefail
DEAD="${1:-100000}"
REPLAY="${2:-20000}"
RUNS="${3:-20}"
PAIRS="${4:-3}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
DBNAME="${RUN_ID}_console"
export ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$DBNAME"
CGROUPS=()
for i in 1 2 3 4 5; do CGROUPS+=("$RUN_ID-g$i.order.consumer"); done
# A group of its own per replay run, so each run replays REPLAY fresh rows.
CLI_GROUPS=()
CONSOLE_GROUPS=()
for i in $(seq "$PAIRS"); do
  CLI_GROUPS+=("$RUN_ID-cli$i.order.consumer")
  CONSOLE_GROUPS+=("$RUN_ID-console$i.order.consumer")
done
TOKEN="bench-operator-token-$RUN_ID"
export ORDERPIPE_CONSOLE__OPERATOR_TOKEN="$TOKEN"
export ORDERPIPE_LAG__GROUPS="[$(printf '"%s",' "${CGROUPS[@]}" | sed 's/,$//')]"
CONSOLE_PID=""
cleanup() {
  [ -n "$CONSOLE_PID" ] && kill "$CONSOLE_PID" 2>/dev/null || true
  SQL -e "DROP DATABASE IF EXISTS $DBNAME" || true
  rm -f "$OUT_DIR/.console.err"
  drop_topics
}
trap cleanup EXIT

echo "== topics (12 partitions) and $((12 * 5)) partition offsets of 5 groups"
mkdb "$DBNAME"
ALL_GROUPS="$(IFS=,; echo "${CGROUPS[*]},${CLI_GROUPS[*]},${CONSOLE_GROUPS[*]}")"
"$BIN" topics ensure --group "$ALL_GROUPS" >/dev/null
"$BIN" produce --count 24000 --orders 2000 --seed 1 --output json >/dev/null
for i in "${!CGROUPS[@]}"; do
  # Committed offsets on every partition, each group further behind than the last.
  "$STACK" kafka-class org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$BOOTSTRAP" \
    --group "${CGROUPS[$i]}" --topic "$TOPIC" --reset-offsets --to-offset $((100 * (i + 1))) --execute >/dev/null
done

echo "== $DEAD dead letters over the 5 groups (SQL)"
# Spread as a 3 a.m. table: 6 classes, 5 event names, 80 % pending, keys = order ids.
SQL "$DBNAME" -e "
INSERT INTO dead_letters (consumer_group, original_topic, original_partition, original_offset, original_timestamp,
  record_key, payload, headers, event_id, event_name, error_class, error_message, attempts, first_failure_ms,
  last_failure_ms, status, dlq_partition, dlq_offset, created_ms, updated_ms)
SELECT CONCAT('$RUN_ID-g', 1 + seq % 5, '.order.consumer'), '$TOPIC', seq % 12, seq, 1700000000000 + seq,
  CAST(seq % 20000 AS CHAR), REPEAT('x', 300), CONCAT('{\"event_id\":\"', UUID(), '\",\"event_name\":\"order.created\"}'),
  UUID(), ELT(1 + seq % 5, 'order.created', 'order.payment.succeeded', 'order.shipped', 'order.canceled', 'order.refunded'),
  ELT(1 + seq % 6, 'handler_fatal', 'handler_retryable', 'unavailable', 'avro_decode', 'invalid_envelope', 'unknown_schema'),
  CONCAT('failure ', seq), 3, 1700000000000 + seq * 10, 1700000000000 + seq * 10,
  IF(seq % 5 = 0, 'replayed', 'pending'), 0, seq, 1700000000000, 1700000000000
FROM seq_1_to_$DEAD;
ANALYZE TABLE dead_letters;" >/dev/null

echo "== orderpipe console"
"$BIN" console --listen 127.0.0.1:0 2> "$OUT_DIR/.console.err" &
CONSOLE_PID=$!
for _ in $(seq 100); do grep -q "console listening on" "$OUT_DIR/.console.err" 2>/dev/null && break; sleep 0.2; done
URL="$(sed -n 's/.*console listening on \(http:[^ ]*\).*/\1/p' "$OUT_DIR/.console.err" | head -1)"
[ -n "$URL" ] || { cat "$OUT_DIR/.console.err" >&2; exit 1; }
AUTH=(-H "Authorization: Bearer $TOKEN")

# time_page NAME PATH: RUNS timed GETs after 2 warm-ups; prints and records median and p95 (ms).
time_page() {
  local name="$1" path="$2" times=() status
  for _ in 1 2; do curl -s -o /dev/null "${AUTH[@]}" "$URL$path"; done
  for _ in $(seq "$RUNS"); do
    read -r status t < <(curl -s -o /dev/null -w '%{http_code} %{time_total}\n' "${AUTH[@]}" "$URL$path")
    [ "$status" = 200 ] || { echo "$path answered $status" >&2; exit 1; }
    times+=("$t")
  done
  read -r median p95 < <(printf '%s\n' "${times[@]}" | python3 -c '
import sys; t = sorted(float(x) * 1000 for x in sys.stdin); print(f"{t[len(t)//2]:.1f} {t[min(len(t)-1, int(len(t)*0.95))]:.1f}")')
  printf '  %-44s median %7s ms   p95 %7s ms\n' "$name" "$median" "$p95"
  result console "$name" "render median" "$median" ms "" "curl -H 'Authorization: Bearer ...' $URL$path (orderpipe console, $DEAD dead letters)"
  result console "$name" "render p95" "$p95" ms "" "curl $URL$path"
}

echo "== render times ($RUNS requests each; $DEAD dead letters, 12 partitions x 5 groups)"
G3="${CGROUPS[2]}"
time_page "overview" "/"
# The overview timed is the real one: every group's card with the broker's lag.
OVERVIEW="$(curl -s "${AUTH[@]}" "$URL/")"
if grep -q "Lag unavailable" <<<"$OVERVIEW"; then echo "the overview had no lag from the broker" >&2; exit 1; fi
for g in "${CGROUPS[@]}"; do grep -q "$g" <<<"$OVERVIEW" || { echo "the overview lacks $g" >&2; exit 1; }; done
echo "  (overview checked: 5 group cards, lag from the broker, total lag $(grep -o 'href="#lag-[0-9]*">[0-9]*' <<<"$OVERVIEW" | sed 's/.*>//' | paste -sd+ | bc))"
time_page "dead letters, no filter" "/dead-letters"
time_page "dead letters, group + pending" "/dead-letters?group=$G3&status=pending"
time_page "dead letters, group + class + pending" "/dead-letters?group=$G3&class=handler_retryable&status=pending"
time_page "dead letters, class only" "/dead-letters?class=avro_decode"
time_page "dead letters, event + since" "/dead-letters?event=order.shipped&since=2023-11-14T22:20:00Z"
time_page "dead letters, order id" "/dead-letters?order_id=4242"
time_page "dead letters, deep page (before=5000)" "/dead-letters?before=5000"
time_page "dead letter detail" "/dead-letters/$((DEAD / 2))"
time_page "held orders" "/held"

# The replay groups' rows only now: the pages above were timed with DEAD rows in the table.
echo "== $REPLAY pending dead letters for each of the $((2 * PAIRS)) replay groups (SQL)"
SQL "$DBNAME" -e "
INSERT INTO dead_letters (consumer_group, original_topic, original_partition, original_offset, original_timestamp,
  record_key, payload, headers, event_id, event_name, error_class, error_message, attempts, first_failure_ms,
  last_failure_ms, status, dlq_partition, dlq_offset, created_ms, updated_ms)
SELECT g.name, '$TOPIC', seq % 12, seq, 1700000000000, CAST(seq % 2000 AS CHAR), REPEAT('x', 300),
  CONCAT('{\"event_id\":\"', UUID(), '\",\"event_name\":\"order.created\"}'), UUID(), 'order.created',
  'handler_fatal', 'bench', 1, 1700000000000, 1700000000000, 'pending', 1, seq, 1700000000000, 1700000000000
FROM seq_1_to_$REPLAY JOIN ($(printf "SELECT '%s' AS name UNION ALL " "${CLI_GROUPS[@]}" "${CONSOLE_GROUPS[@]}" | sed 's/ UNION ALL $//')) g;
ANALYZE TABLE dead_letters;" >/dev/null
now() { date +%s.%N; }
# CPU seconds (user + system) process PID has used so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f\n", ($14 + $15) / hz }' "/proc/$1/stat"; }
# replay_row ID: rows replayed and milliseconds from the dlq_replays row's start to its end.
replay_row() { SQL "$DBNAME" -e "SELECT replayed, finished_ms - started_ms FROM dlq_replays WHERE id = $1 AND state = 'done'"; }
REPLAYS="$OUT_DIR/.replays.tsv"
: > "$REPLAYS"

echo "== the console's own CPU while idle (10 s: its background lag measurement every 5 s)"
c0=$(cpu_s "$CONSOLE_PID"); sleep 10; c1=$(cpu_s "$CONSOLE_PID")
IDLE_CPU=$(python3 -c "print(f'{($c1 - $c0) / 10 * 100:.0f}')")
echo "  console idle: $IDLE_CPU % of a core"

# cli_run GROUP: one `dlq replay` run; appends "cli wall_s row_ms rows cpu_s" to $REPLAYS.
cli_run() {
  local t0 t1 id rows ms
  t0=$(now)
  /usr/bin/time -f '%U %S' -o "$OUT_DIR/.cli-time" "$BIN" dlq replay --group "$1" --yes --output json > "$OUT_DIR/.cli-replay.json"
  t1=$(now)
  [ "$(jget "$OUT_DIR/.cli-replay.json" "r['replayed']")" = "$REPLAY" ] || { echo "dlq replay: $(cat "$OUT_DIR/.cli-replay.json")" >&2; exit 1; }
  id=$(SQL "$DBNAME" -e "SELECT MAX(id) FROM dlq_replays WHERE origin = 'cli'")
  read -r rows ms < <(replay_row "$id")
  [ "$rows" = "$REPLAY" ] || { echo "dlq_replays row $id: '$rows' rows replayed" >&2; exit 1; }
  echo "cli $(python3 -c "print($t1 - $t0)") $ms $rows $(awk '{print $1 + $2}' "$OUT_DIR/.cli-time")" >> "$REPLAYS"
}

# console_run GROUP: dry-run page, confirm, poll the progress page every second until done; appends
# "console wall_s row_ms rows cpu_s" (cpu: the console process over the run, its background work included).
console_run() {
  local page csrf count upto t2 t3 c2 c3 location state run rows ms
  page="$(curl -s "${AUTH[@]}" "$URL/dead-letters/replay?group=$1")"
  field() { sed -n "s/.*name=\"$1\" value=\"\([^\"]*\)\".*/\1/p" <<<"$page" | head -1; }
  csrf="$(field csrf_token)"; count="$(field count)"; upto="$(field upto)"
  [ "$count" = "$REPLAY" ] || { echo "the dry run counted '$count', not $REPLAY" >&2; exit 1; }
  c2=$(cpu_s "$CONSOLE_PID"); t2=$(now)
  location="$(curl -s -o /dev/null -w '%{redirect_url}' "${AUTH[@]}" -X POST \
    --data-urlencode "csrf_token=$csrf" --data-urlencode "group=$1" --data-urlencode "status=pending" \
    --data-urlencode "count=$count" --data-urlencode "upto=$upto" "$URL/dead-letters/replay")"
  [ -n "$location" ] || { echo "the confirmation was not accepted" >&2; exit 1; }
  # Polled as the page reloads itself in a browser (every second while it runs); the rate is
  # taken from the dlq_replays row, so the poll's granularity does not count.
  until state="$(curl -s "${AUTH[@]}" "$location" | sed -n 's/.*id="replay-state">\([^<]*\)<.*/\1/p')"; [[ "$state" != Running* && -n "$state" ]]; do
    sleep 1
  done
  t3=$(now); c3=$(cpu_s "$CONSOLE_PID")
  [ "$(sed -n 's/^Done: \([0-9]*\) replayed.*/\1/p' <<<"$state")" = "$REPLAY" ] || { echo "console replay: $state" >&2; exit 1; }
  run="${location##*/}"
  read -r rows ms < <(replay_row "$run")
  [ "$rows" = "$REPLAY" ] || { echo "dlq_replays row $run: '$rows' rows replayed" >&2; exit 1; }
  echo "console $(python3 -c "print($t3 - $t2)") $ms $rows $(python3 -c "print($c3 - $c2)")" >> "$REPLAYS"
}

echo "== bulk replay of $REPLAY dead letters, $PAIRS x CLI and $PAIRS x console, alternating"
# Each run starts after SETTLE seconds of quiet: a run right after another
# was slower, whichever side it was (the broker and MariaDB still writing the
# previous run's records and rows), and the side run second lost.
SETTLE="${SETTLE:-5}"
cli_replay() { sleep "$SETTLE"; cli_run "$@"; }
console_replay() { sleep "$SETTLE"; console_run "$@"; }
for i in $(seq 0 $((PAIRS - 1))); do
  if (( i % 2 == 0 )); then cli_replay "${CLI_GROUPS[$i]}"; console_replay "${CONSOLE_GROUPS[$i]}"
  else console_replay "${CONSOLE_GROUPS[$i]}"; cli_replay "${CLI_GROUPS[$i]}"; fi
done
read -r CLI_RATE CONSOLE_RATE < <(python3 - "$REPLAYS" <<'PY'
import sys, statistics as st
runs = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {}
for side, label in (("cli", "dlq replay (CLI)"), ("console", "console replay")):
    rs = [r for r in runs if r[0] == side]
    row = [int(r[3]) * 1000 / int(r[2]) for r in rs]
    wall = [int(r[3]) / float(r[1]) for r in rs]
    cpu = [float(r[4]) for r in rs]
    med[side] = (st.median(row), st.median(wall))
    print(f"  {label:<20} dlq_replays row: {' '.join(f'{x:7.0f}' for x in row)} rows/s (median {st.median(row):.0f});"
          f" wall: {' '.join(f'{x:7.0f}' for x in wall)} (median {st.median(wall):.0f}); CPU {' '.join(f'{x:.1f}' for x in cpu)} s",
          file=sys.stderr)
print(f"  console / CLI        dlq_replays row {med['console'][0] / med['cli'][0]:.3f}; wall {med['console'][1] / med['cli'][1]:.3f}", file=sys.stderr)
# The machine drifts between runs (shared cores, other work): the ratio within each pair, run back to back, too.
cli = [int(r[2]) for r in runs if r[0] == "cli"]
con = [int(r[2]) for r in runs if r[0] == "console"]
pairs = [c / k for c, k in zip(cli, con)]
print(f"  console / CLI by pair (dlq_replays row) {' '.join(f'{x:.2f}' for x in pairs)} (median {st.median(pairs):.3f})", file=sys.stderr)
print(f"{med['cli'][0]:.0f} {med['console'][0]:.0f}")
PY
)
result console "bulk replay" throughput "$CONSOLE_RATE" rec/s "dlq replay (CLI)" "orderpipe console: POST /dead-letters/replay (confirmed), median of $PAIRS, timed by its dlq_replays row"
result console "dlq replay (CLI)" throughput "$CLI_RATE" rec/s "" "orderpipe dlq replay --group G --yes, median of $PAIRS, timed by its dlq_replays row"
result console "console idle" cpu "$IDLE_CPU" % "" "orderpipe console, 10 s without requests (background lag measurement)"
rm -f "$OUT_DIR/.cli-replay.json" "$OUT_DIR/.cli-time" "$REPLAYS"
