#!/usr/bin/env bash
# End-to-end latency, honestly: from the order API's commit to the
# consumer's commit, both stamped right AFTER their commits (harness::latency:
# `bench-drive-orders --stamps`, `[chaos] commit_stamps`), joined on the
# event id. The relay is woken by the API (outbox.wake_targets ->
# relay --wake-listen). Two runs:
#   a. RATE orders/s (default 100) for 30 s;
#   b. EVENTS outbox events/s (default 5,000; an order writes ~4.05 outbox
#      rows: order + inventory events) for 60 s, with the outbox backlog and
#      the consumer's lag sampled every 2 s and their slope reported.
#   A driver that falls behind its rate is stopped at twice the run length
#   (its drive.json says so); what it drove is measured.
# Each run: p50/p90/p99/p99.9/max (log-linear histogram) as `result` rows,
# the split at the relay's mark (sent_ms), the relay's Kafka commit
# histogram, and its latencies in target/bench/latency-<run>.txt (the
# report's CDF).
#
#   dev/bench-latency.sh [RATE] [EVENTS] [SECS_A] [SECS_B]   (called by dev/bench-relay.sh)
#   RUNS=low (or high) runs one of the two. SOURCE=binlog runs the log-based
#   relay (`relay --source binlog`, no wake-up, no poll) instead of the
#   polling one; its runs are named low-binlog / high-binlog.
# A broker in its first minutes after a start adds a tail of its own (up to
# p99 ~400 ms here), which fades over the next runs (docs/tuning.md, "A
# fresh broker's first minutes"); each run reports the broker's uptime,
# and `make bench` runs this after minutes of other benchmarks.
set -euo pipefail
RATE="${1:-100}"
EVENTS="${2:-5000}"
SECS_A="${3:-30}"
SECS_B="${4:-60}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
PY="$ROOT/dev/bench-latency.py"
# A run id of its own: bench-common's is the second it started, which another
# benchmark started in the same second shares (and deletes the topics of).
RUN_ID="lat$(date +%s)p$$"
export ORDERPIPE_TOPICS__ORDER_EVENTS__NAME="$RUN_ID.order.events.v1"
export ORDERPIPE_TOPICS__INVENTORY_EVENTS__NAME="$RUN_ID.inventory.events.v1"
export ORDERPIPE_TOPICS__DEAD_LETTER__NAME="$RUN_ID.order.events.v1.dlq"
DB="${RUN_ID}lat"
export ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$DB"
SQL -e "CREATE DATABASE $DB"
"$BIN" migrate >/dev/null
GROUP="$RUN_ID-latency"
"$BIN" topics ensure --group "$GROUP" >/dev/null
WORK="$OUT_DIR/.latency-$RUN_ID"
mkdir -p "$WORK"
LAT_DIR="$(dirname "$RESULTS")"
# Runs before this script wrote one file of latencies; the report would draw it as a run.
rm -f "$LAT_DIR/relay-latency-ms.txt"
# Rows per order, order-topic events per order (generator shares, seed-independent averages).
ROWS_PER_ORDER=4.05

# The port the child announced on stderr (`... on udp://HOST:PORT` / `http://HOST:PORT`).
announced() {
  local file="$1" pattern="$2"
  for _ in $(seq 1 300); do
    addr=$(grep -o "$pattern[0-9.:]*" "$file" 2>/dev/null | head -1 | sed "s|$pattern||") || true
    [ -n "$addr" ] && { echo "$addr"; return; }
    sleep 0.1
  done
  echo "no address announced in $file" >&2; return 1
}

SOURCE="${SOURCE:-poll}"
if [ "$SOURCE" = binlog ]; then
  export ORDERPIPE_OUTBOX__BINLOG_NAME="$RUN_ID-outbox" ORDERPIPE_OUTBOX__OFFSETS_TOPIC="$RUN_ID.outbox.offsets"
  export ORDERPIPE_OUTBOX__BINLOG_SERVER_ID=$(( 100000 + RANDOM * 7 + $$ % 1000 ))
fi

run() {
  local label="$1" slug="$2" orders="$3" rate="$4" drivers="$5" secs="$6"
  : > "$WORK/api.tsv"; : > "$WORK/applied.tsv"
  if [ "$SOURCE" = binlog ]; then
    label="$label, log-based relay"; slug="$slug-binlog"
    echo "== $label: $orders orders at $rate orders/s ($drivers drivers), relay reading the binlog"
    RELAY_CMD=(relay --source binlog --instance "bench-lat-$slug" --health-addr 127.0.0.1:0)
  else
    echo "== $label: $orders orders at $rate orders/s ($drivers drivers), relay woken by the API"
    RELAY_CMD=(relay --source poll --instance "bench-lat-$slug" --batch-size 500 --poll-ms 100 --wake-listen 127.0.0.1:0 --health-addr 127.0.0.1:0)
  fi
  "$BIN" "${RELAY_CMD[@]}" > /dev/null 2> "$WORK/relay.err" &
  RELAY=$!
  ORDERPIPE_CHAOS__COMMIT_STAMPS="$WORK/applied.tsv" "$BIN" consume --group "$GROUP" --handler notification \
    --start-from latest --health-addr 127.0.0.1:0 > /dev/null 2> "$WORK/consumer.err" &
  CONSUMER=$!
  WAKE=""
  [ "$SOURCE" = binlog ] || WAKE=$(announced "$WORK/relay.err" "relay wake-up listening on udp://")
  RELAY_HTTP=$(announced "$WORK/relay.err" "health endpoints on http://")
  CONSUMER_HTTP=$(announced "$WORK/consumer.err" "health endpoints on http://")
  # Leases, producers, the group's first assignment.
  sleep 8
  # The broker's uptime, when it runs on this machine (the dev stack).
  local uptime="" broker
  broker=$(broker_pid) && uptime=$(ps -o etimes= -p "$broker" | tr -d ' ')
  echo "broker uptime: ${uptime:-unknown (not a local process)} s"
  python3 "$PY" scrape "http://$RELAY_HTTP/metrics" > "$WORK/relay.before.json"
  python3 "$PY" scrape "http://$CONSUMER_HTTP/metrics" > "$WORK/consumer.before.json"
  : > "$WORK/samples"
  (
    t0=$(date +%s.%N)
    while sleep 2; do
      # The log-based relay deletes what it published; the polling one marks it.
      backlog=$(SQL -e "SELECT COUNT(*) FROM $DB.outbox_messages WHERE sent_ms IS NULL" 2>/dev/null || echo 0)
      lag=$(curl -s "http://$CONSUMER_HTTP/metrics" | awk '/^orderpipe_consumer_lag_records/ {s += $NF} END {print s + 0}')
      echo "$(python3 -c "import time; print(round(time.time() - $t0, 2))") $backlog $lag" >> "$WORK/samples"
    done
  ) &
  SAMPLER=$!
  # A driver that cannot keep the rate (the API's commits are the limit on a
  # loaded box) is stopped at twice the run's length; what it did is measured.
  local targets="[]"; [ -n "$WAKE" ] && targets="[\"$WAKE\"]"
  ORDERPIPE_OUTBOX__WAKE_TARGETS="$targets" timeout "$((secs * 2 + 10))" "$BIN" bench-drive-orders --orders "$orders" \
    --rate "$rate" --drivers "$drivers" --seed 2 --stamps "$WORK/api.tsv" > "$WORK/drive.json" \
    || echo "{\"stopped\": \"after $((secs * 2 + 10)) s, behind the rate\", \"events\": $(wc -l < "$WORK/api.tsv")}" > "$WORK/drive.json"
  # Let the tail drain (applied stamps stop growing for 3 s, at most 60 s).
  local last=-1 same=0
  for _ in $(seq 1 60); do
    now=$(wc -l < "$WORK/applied.tsv")
    if [ "$now" = "$last" ]; then same=$((same + 1)); [ $same -ge 3 ] && break; else same=0; fi
    last=$now; sleep 1
  done
  kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true
  python3 "$PY" scrape "http://$RELAY_HTTP/metrics" > "$WORK/relay.after.json"
  python3 "$PY" scrape "http://$CONSUMER_HTTP/metrics" > "$WORK/consumer.after.json"
  kill -TERM "$RELAY" "$CONSUMER"; wait "$RELAY" "$CONSUMER" 2>/dev/null || true
  SQL -e "SELECT event_id, sent_ms FROM $DB.outbox_messages WHERE sent_ms IS NOT NULL" > "$WORK/sent.tsv"
  python3 "$PY" join "$WORK/api.tsv" "$WORK/applied.tsv" "$WORK/sent.tsv" "$LAT_DIR/latency-$slug.txt" "$label" > "$WORK/lat.json"
  python3 "$PY" histo "$WORK/relay.before.json" "$WORK/relay.after.json" orderpipe_relay_commit_duration_seconds > "$WORK/commit.json"
  python3 "$PY" histo "$WORK/consumer.before.json" "$WORK/consumer.after.json" orderpipe_handler_duration_seconds > "$WORK/handler.json"
  python3 "$PY" stages "$WORK/relay.before.json" "$WORK/relay.after.json" orderpipe_relay_stage_duration_seconds > "$WORK/stages.json"
  python3 "$PY" slope "$WORK/samples" > "$WORK/slope.json"
  echo "driver: $(cat "$WORK/drive.json")"
  echo "latency (ms): $(cat "$WORK/lat.json")"
  echo "relay Kafka commit: $(cat "$WORK/commit.json")"
  echo "consumer handler: $(cat "$WORK/handler.json")"
  echo "relay stages:"; cat "$WORK/stages.json"
  echo "backlog/lag every 2 s: $(cat "$WORK/slope.json")"
  local cmd="SOURCE=$SOURCE dev/bench-latency.sh: orderpipe ${RELAY_CMD[*]} & ORDERPIPE_CHAOS__COMMIT_STAMPS=F orderpipe consume --handler notification & ORDERPIPE_OUTBOX__WAKE_TARGETS=[relay] orderpipe bench-drive-orders --orders $orders --rate $rate --drivers $drivers --stamps F"
  for p in p50 p90 p99 p99.9 max; do
    result relay "API commit → consumer commit, $label" "$p latency" "$(jget "$WORK/lat.json" "r['$p']")" ms "" "$cmd"
  done
  [ -z "$uptime" ] || result relay "API commit → consumer commit, $label" "broker uptime at start" "$uptime" s "" "$cmd"
  result relay "API commit → consumer commit, $label" "events measured" "$(jget "$WORK/lat.json" "r['n']")" events "" "$cmd"
  result relay "API commit → consumer commit, $label" "p99 API commit → Kafka produce" "$(jget "$WORK/lat.json" "r['api_commit_to_kafka_produce']['p99']")" ms "" "$cmd"
  result relay "API commit → consumer commit, $label" "p99 Kafka produce → consumer commit" "$(jget "$WORK/lat.json" "r['kafka_produce_to_applied']['p99']")" ms "" "$cmd"
  if [ "$slug" = "high" ]; then
    result relay "API commit → consumer commit, $label" "outbox backlog slope" "$(jget "$WORK/slope.json" "r.get('backlog_slope_per_s', 'nan')")" "rows/s per s" "" "$cmd"
    result relay "API commit → consumer commit, $label" "consumer lag slope" "$(jget "$WORK/slope.json" "r.get('lag_slope_per_s', 'nan')")" "records/s per s" "" "$cmd"
  fi
}

# Several drivers even at a low rate: one waits out each request's commit
# (three or four per order), and under load falls behind the rate.
RUNS="${RUNS:-low high}"
[[ " $RUNS " != *" low "* ]] || run "$RATE orders/s" low $((RATE * SECS_A)) "$RATE" 4 "$SECS_A"
HIGH_ORDERS_PER_S=$(python3 -c "print(round($EVENTS / $ROWS_PER_ORDER))")
[[ " $RUNS " != *" high "* ]] || run "$EVENTS events/s ($HIGH_ORDERS_PER_S orders/s)" high $((HIGH_ORDERS_PER_S * SECS_B)) "$HIGH_ORDERS_PER_S" 32 "$SECS_B"
rm -rf "$WORK"
SQL -e "DROP DATABASE $DB" || true
