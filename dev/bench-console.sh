#!/usr/bin/env bash
# The console's numbers, one run, same broker and MariaDB (a measurement,
# not a test):
#   1. render time of the overview (/) and the dead-letter list (several
#      filters, a deep keyset page) with DEAD dead letters in the table and
#      12 partitions x 5 consumer groups with committed offsets (lag): server
#      time as curl sees it, median and p95 of RUNS requests after a warm-up;
#      target <= 200 ms;
#   2. bulk replay throughput, console vs CLI: REPLAY pending dead letters of
#      one group replayed by `orderpipe dlq replay --yes`, the same number of
#      another group's by the console (dry-run page, confirm POST, progress
#      page polled every 100 ms until done), rows/s each.
#
#   dev/bench-console.sh [DEAD] [REPLAY] [RUNS]   (defaults 100000 20000 20; needs `make dev-up`)
#   ORDERPIPE_BIN=target/debug/orderpipe dev/bench-console.sh   (a debug build: slower rendering)
set -euo pipefail
DEAD="${1:-100000}"
REPLAY="${2:-20000}"
RUNS="${3:-20}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
DBNAME="${RUN_ID}_console"
export ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$DBNAME"
CGROUPS=()
for i in 1 2 3 4 5; do CGROUPS+=("$RUN_ID-g$i.order.consumer"); done
CLI_GROUP="$RUN_ID-cli.order.consumer"
CONSOLE_GROUP="$RUN_ID-console.order.consumer"
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
ALL_GROUPS="$(IFS=,; echo "${CGROUPS[*]},$CLI_GROUP,$CONSOLE_GROUP")"
"$BIN" topics ensure --group "$ALL_GROUPS" >/dev/null
"$BIN" produce --count 24000 --orders 2000 --seed 1 --output json >/dev/null
for i in "${!CGROUPS[@]}"; do
  # Committed offsets on every partition, each group further behind than the last.
  "$STACK" kafka-class org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$BOOTSTRAP" \
    --group "${CGROUPS[$i]}" --topic "$TOPIC" --reset-offsets --to-offset $((100 * (i + 1))) --execute >/dev/null
done

echo "== $DEAD dead letters over the 5 groups (SQL), $REPLAY pending for each replay group"
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
INSERT INTO dead_letters (consumer_group, original_topic, original_partition, original_offset, original_timestamp,
  record_key, payload, headers, event_id, event_name, error_class, error_message, attempts, first_failure_ms,
  last_failure_ms, status, dlq_partition, dlq_offset, created_ms, updated_ms)
SELECT g.name, '$TOPIC', seq % 12, seq, 1700000000000, CAST(seq % 2000 AS CHAR), REPEAT('x', 300),
  CONCAT('{\"event_id\":\"', UUID(), '\",\"event_name\":\"order.created\"}'), UUID(), 'order.created',
  'handler_fatal', 'bench', 1, 1700000000000, 1700000000000, 'pending', 1, seq, 1700000000000, 1700000000000
FROM seq_1_to_$REPLAY JOIN (SELECT '$CLI_GROUP' AS name UNION ALL SELECT '$CONSOLE_GROUP') g;
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

now() { date +%s.%N; }
echo "== bulk replay of $REPLAY dead letters: CLI"
t0=$(now)
"$BIN" dlq replay --group "$CLI_GROUP" --yes --output json > "$OUT_DIR/.cli-replay.json"
t1=$(now)
CLI_ROWS=$(jget "$OUT_DIR/.cli-replay.json" "r['replayed']")
CLI_RATE=$(python3 -c "print($CLI_ROWS / ($t1 - $t0))")

echo "== bulk replay of $REPLAY dead letters: console"
PAGE="$(curl -s "${AUTH[@]}" "$URL/dead-letters/replay?group=$CONSOLE_GROUP")"
field() { sed -n "s/.*name=\"$1\" value=\"\([^\"]*\)\".*/\1/p" <<<"$PAGE" | head -1; }
CSRF="$(field csrf_token)"; COUNT="$(field count)"; UPTO="$(field upto)"
[ "$COUNT" = "$REPLAY" ] || { echo "the dry run counted '$COUNT', not $REPLAY" >&2; exit 1; }
t2=$(now)
LOCATION="$(curl -s -o /dev/null -w '%{redirect_url}' "${AUTH[@]}" -X POST \
  --data-urlencode "csrf_token=$CSRF" --data-urlencode "group=$CONSOLE_GROUP" --data-urlencode "status=pending" \
  --data-urlencode "count=$COUNT" --data-urlencode "upto=$UPTO" "$URL/dead-letters/replay")"
[ -n "$LOCATION" ] || { echo "the confirmation was not accepted" >&2; exit 1; }
until STATE="$(curl -s "${AUTH[@]}" "$LOCATION" | sed -n 's/.*id="replay-state">\([^<]*\)<.*/\1/p')"; [[ "$STATE" != Running* && -n "$STATE" ]]; do
  sleep 0.1
done
t3=$(now)
CONSOLE_ROWS="$(sed -n 's/^Done: \([0-9]*\) replayed.*/\1/p' <<<"$STATE")"
[ "$CONSOLE_ROWS" = "$REPLAY" ] || { echo "console replay: $STATE" >&2; exit 1; }
CONSOLE_RATE=$(python3 -c "print($CONSOLE_ROWS / ($t3 - $t2))")
printf '  %-44s %10.0f rows/s (%s rows, %.1f s)\n' "dlq replay (CLI)" "$CLI_RATE" "$CLI_ROWS" "$(python3 -c "print($t1-$t0)")"
printf '  %-44s %10.0f rows/s (%s rows, %.1f s)\n' "console replay (confirm to done)" "$CONSOLE_RATE" "$CONSOLE_ROWS" "$(python3 -c "print($t3-$t2)")"
printf '  %-44s %10.3f\n' "console / CLI" "$(python3 -c "print($CONSOLE_RATE / $CLI_RATE)")"
result console "bulk replay" throughput "$CONSOLE_RATE" rec/s "dlq replay (CLI)" "orderpipe console: GET /dead-letters/replay?group=G, POST /dead-letters/replay (confirmed), poll the progress page"
result console "dlq replay (CLI)" throughput "$CLI_RATE" rec/s "" "orderpipe dlq replay --group G --yes --output json"
rm -f "$OUT_DIR/.cli-replay.json"
