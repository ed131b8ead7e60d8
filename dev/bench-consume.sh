#!/usr/bin/env bash
# Consumer throughput on one backlog, four peers in one run, same broker and
# MariaDB:
#   (a) kafka-consumer-perf-test reading the backlog (the broker's ceiling),
#   (b) orderpipe consume: dedup + one handler (notification) on MariaDB,
#       batched per partition,
#   (c) seed 004's algorithm literally: per record begin, INSERT IGNORE,
#       effect, commit, synchronous offset commit (first NAIVE records only:
#       it is slow),
#   (d) the database's ceiling (`orderpipe bench-db-ceiling`): the rows (b)
#       stored (event_dedup + notifications), written again into a fresh
#       database with nothing else, one multi-row INSERT IGNORE per table per
#       transaction, with (b)'s events per transaction (its mean, from
#       MariaDB's commit counter) and a connection per partition (b) applied;
#       checked to store the same rows as (b). b/d is how close orderpipe
#       gets to what the database can take.
# (b), (c) and (d) also report MariaDB statements per event, and (b) and (d)
# MariaDB's CPU time per event (global counters and the server's /proc
# times read before and after each run: run on a quiet server).
#
#   dev/bench-consume.sh [COUNT] [NAIVE]   (defaults 1000000 and 50000; needs `make dev-up`)
#   CEILING_TX=N CEILING_CONNECTIONS=C     (d) with other sizes than (b)'s
set -euo pipefail
COUNT="${1:-1000000}"
NAIVE="${2:-50000}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"


echo "== backlog: $COUNT events in $TOPIC"
"$BIN" topics ensure --group "$RUN_ID-orderpipe" >/dev/null
"$BIN" produce --count "$COUNT" --orders 10000 --seed 1 --output json >/dev/null

echo "== (a) kafka-consumer-perf-test"
PERF_ARGS=(kafka-class org.apache.kafka.tools.ConsumerPerformance
  --bootstrap-server "$BOOTSTRAP" --topic "$TOPIC" --num-records "$COUNT" --group "$RUN_ID-perf"
  --command-property isolation.level=read_committed)
/usr/bin/time -f '%M' -o "$OUT_DIR/.rss" "$STACK" "${PERF_ARGS[@]}" 2>/dev/null | tee "$OUT_DIR/.perf.txt" | tail -1
PERF_RSS=$(cat "$OUT_DIR/.rss")
PERF_RATE=$(tail -1 "$OUT_DIR/.perf.txt" | awk -F', *' '{print $NF}')

echo "== (b) orderpipe consume --handler notification (MariaDB)"
mkdb "${RUN_ID}_b"
OP_ARGS=(consume --migrate --group "$RUN_ID-orderpipe" --handler notification --until-idle 5 --output json)
db_cpu "$OUT_DIR/.cpu0"; db_counters "$OUT_DIR/.db0"
ORDERPIPE_DATABASE__URL="$DB_URL_BASE/${RUN_ID}_b" /usr/bin/time -f '%M' -o "$OUT_DIR/.rss" \
  "$BIN" "${OP_ARGS[@]}" > "$OUT_DIR/.op.json"
db_counters "$OUT_DIR/.db1"; db_cpu "$OUT_DIR/.cpu1"
OP_RSS=$(cat "$OUT_DIR/.rss")
read -r OP_RATE OP_APPLIED OP_SECS <<<"$(python3 -c '
import json,sys; r=json.load(open(sys.argv[1])); print(r["applied"]/r["active_secs"], r["applied"], r["active_secs"])' "$OUT_DIR/.op.json")"
[ "$OP_APPLIED" = "$COUNT" ] || { echo "orderpipe applied $OP_APPLIED of $COUNT" >&2; exit 1; }
{ read -r OP_STMTS; read -r OP_STMT_MIX; } < <(per_event "$OUT_DIR/.db0" "$OUT_DIR/.db1" "$OP_APPLIED")
OP_CPU=$(cpu_per_event "$OUT_DIR/.cpu0" "$OUT_DIR/.cpu1" "$OP_APPLIED")
OP_COMMITS=$(counter "$OUT_DIR/.db0" "$OUT_DIR/.db1" Com_commit)

# (d) writes what (b) wrote, as (b) wrote it: its mean events per
# transaction (batches are what waits in a partition's queue, up to
# consumer.batch_size) and a connection per partition worker.
CEIL_TX="${CEILING_TX:-$(( (OP_APPLIED + OP_COMMITS / 2) / (OP_COMMITS > 0 ? OP_COMMITS : 1) ))}"
CEIL_CONN="${CEILING_CONNECTIONS:-$(SQL -e "SELECT COUNT(DISTINCT kafka_partition) FROM ${RUN_ID}_b.event_dedup")}"
echo "== (d) the database's ceiling: (b)'s rows, $CEIL_TX events per tx, $CEIL_CONN connections"
mkdb "${RUN_ID}_d"
CEIL_ARGS=(--log-level error bench-db-ceiling --from "$DB_URL_BASE/${RUN_ID}_b" --events-per-tx "$CEIL_TX" --connections "$CEIL_CONN")
# The counters and CPU time around the writes alone: it reads (b)'s rows and
# opens its connections, says `ready`, and writes on a line from us.
# (Bash drops a coprocess's variables once it has exited: copies of them.)
coproc CEILING { ORDERPIPE_DATABASE__URL="$DB_URL_BASE/${RUN_ID}_d" exec "$BIN" "${CEIL_ARGS[@]}" --start-on-stdin; }
CEIL_PID=$CEILING_PID
exec {CEIL_OUT}<&"${CEILING[0]}" {CEIL_IN}>&"${CEILING[1]}"
read -r READY <&"$CEIL_OUT" || true
[ "$READY" = ready ] || { echo "bench-db-ceiling failed before writing" >&2; exit 1; }
db_cpu "$OUT_DIR/.cpu0"; db_counters "$OUT_DIR/.db0"
echo go >&"$CEIL_IN"
cat <&"$CEIL_OUT" > "$OUT_DIR/.ceil.json"
exec {CEIL_OUT}<&- {CEIL_IN}>&-
wait "$CEIL_PID" || { echo "bench-db-ceiling failed" >&2; exit 1; }
db_counters "$OUT_DIR/.db1"; db_cpu "$OUT_DIR/.cpu1"
CEIL_RATE=$(jget "$OUT_DIR/.ceil.json" 'r["events_per_sec"]') CEIL_EVENTS=$(jget "$OUT_DIR/.ceil.json" 'r["events"]')
# The same rows: counts and a checksum of every column either writer sets.
stored() {
  SQL -e "SELECT (SELECT CONCAT(COUNT(*), ' ', COALESCE(SUM(CRC32(CONCAT_WS(',', group_id, HEX(event_id), topic,
      kafka_partition, kafka_offset, event_type, record_key, HEX(payload_digest)))), 0)) FROM $1.event_dedup),
    (SELECT CONCAT(COUNT(*), ' ', COALESCE(SUM(CRC32(CONCAT_WS(',', event_id, order_id, kind))), 0)) FROM $1.notifications)"
}
B_ROWS="$(stored "${RUN_ID}_b")" D_ROWS="$(stored "${RUN_ID}_d")"
[ "$B_ROWS" = "$D_ROWS" ] && [ "$CEIL_EVENTS" = "$OP_APPLIED" ] || {
  echo "(d) stored other rows than (b): event_dedup/notifications (count checksum) (b) $B_ROWS, (d) $D_ROWS; events $CEIL_EVENTS of $OP_APPLIED" >&2
  exit 1
}
echo "   same rows as (b): $B_ROWS (event_dedup, notifications: count checksum)"
{ read -r CEIL_STMTS; read -r CEIL_STMT_MIX; } < <(per_event "$OUT_DIR/.db0" "$OUT_DIR/.db1" "$CEIL_EVENTS")
CEIL_CPU=$(cpu_per_event "$OUT_DIR/.cpu0" "$OUT_DIR/.cpu1" "$CEIL_EVENTS")

echo "== (c) naive per-record consumer, first $NAIVE records"
mkdb "${RUN_ID}_c"
NAIVE_ARGS=(bench-naive-consume --group "$RUN_ID-naive" --handler notification --limit "$NAIVE")
db_counters "$OUT_DIR/.db0"
ORDERPIPE_DATABASE__URL="$DB_URL_BASE/${RUN_ID}_c" /usr/bin/time -f '%M' -o "$OUT_DIR/.rss" \
  "$BIN" "${NAIVE_ARGS[@]}" > "$OUT_DIR/.naive.json"
db_counters "$OUT_DIR/.db1"
NAIVE_RSS=$(cat "$OUT_DIR/.rss")
NAIVE_RATE=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["events_per_sec"])' "$OUT_DIR/.naive.json")
{ read -r NAIVE_STMTS; read -r NAIVE_STMT_MIX; } < <(per_event "$OUT_DIR/.db0" "$OUT_DIR/.db1" "$NAIVE")

python3 - "$OUT_DIR/consume-$RUN_ID.json" <<PY
import json
count, naive, a, b, c, d = $COUNT, $NAIVE, $PERF_RATE, $OP_RATE, $NAIVE_RATE, $CEIL_RATE
rss = {"perftest": $PERF_RSS, "orderpipe": $OP_RSS, "naive": $NAIVE_RSS}
stmts = {"orderpipe": $OP_STMTS, "naive": $NAIVE_STMTS, "ceiling": $CEIL_STMTS}
mix = {"orderpipe": "$OP_STMT_MIX", "naive": "$NAIVE_STMT_MIX", "ceiling": "$CEIL_STMT_MIX"}
cpu = {"orderpipe": $OP_CPU, "ceiling": $CEIL_CPU}
tx, conn = $CEIL_TX, $CEIL_CONN
print()
print(f"backlog {count} events, same broker and MariaDB; (c) measured over its first {naive} records")
print(f"{'peer':<78} {'events/s':>10} {'peak RSS':>9} {'stmts/event':>12} {'DB CPU us/event':>16}")
for name, rate, r, s, u in [
    ("(a) kafka-consumer-perf-test (fetch only, no decode, no DB)", a, f"{rss['perftest'] / 1024:.0f}MB", "", ""),
    ("(b) orderpipe consume: decode + dedup + notification, batched", b, f"{rss['orderpipe'] / 1024:.0f}MB",
     f"{stmts['orderpipe']:.4f}", f"{cpu['orderpipe']:.1f}"),
    ("(c) naive: 1 tx + 1 sync offset commit per record", c, f"{rss['naive'] / 1024:.0f}MB", f"{stmts['naive']:.4f}", ""),
    (f"(d) the database's ceiling: the same rows, {tx} events per tx, {conn} connections", d, "",
     f"{stmts['ceiling']:.4f}", f"{cpu['ceiling']:.1f}"),
]:
    print(f"{name:<78} {rate:>10,.0f} {r:>9} {s:>12} {u:>16}")
print(f"b/a = {b/a:.3f}   b/c = {b/c:.1f}x   b/d = {b/d:.3f}   MariaDB CPU per event b/d = {cpu['orderpipe'] / cpu['ceiling']:.2f}")
print(f"MariaDB statements per event by kind: (b) {mix['orderpipe']}   (c) {mix['naive']}   (d) {mix['ceiling']}")
json.dump({"count": count, "naive_records": naive, "perftest_eps": a, "orderpipe_eps": b,
           "naive_eps": c, "ceiling_eps": d, "ceiling_events_per_tx": tx, "ceiling_connections": conn,
           "b_over_a": b/a, "b_over_c": b/c, "b_over_d": b/d, "rss_kb": rss,
           "statements_per_event": stmts, "statements_per_event_by_kind": mix,
           "mariadb_cpu_us_per_event": cpu}, open("$OUT_DIR/consume-$RUN_ID.json", "w"), indent=2)
PY
PERF=kafka-consumer-perf-test OURS="orderpipe consume (notification)" NAIVE_PEER="naive per-record"
CEIL="database ceiling (same rows)"
PERF_CMD="dev/stack.sh ${PERF_ARGS[*]}"
OP_CMD="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/${RUN_ID}_b orderpipe ${OP_ARGS[*]}"
NAIVE_CMD="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/${RUN_ID}_c orderpipe ${NAIVE_ARGS[*]}"
CEIL_CMD="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/${RUN_ID}_d orderpipe ${CEIL_ARGS[*]}"
result consume "$PERF" throughput "$PERF_RATE" events/s "" "$PERF_CMD"
# orderpipe against the database's ceiling (b/d); the naive consumer against orderpipe (c/b).
result consume "$OURS" throughput "$OP_RATE" events/s "$CEIL" "$OP_CMD"
result consume "$CEIL" throughput "$CEIL_RATE" events/s "" "$CEIL_CMD"
result consume "$NAIVE_PEER" throughput "$NAIVE_RATE" events/s "$OURS" "$NAIVE_CMD"
result consume "$OURS" "backlog drained in" "$OP_SECS" s "" "$OP_CMD"
result consume "$PERF" "peak RSS" "$((PERF_RSS / 1024))" MB "" "$PERF_CMD"
result consume "$OURS" "peak RSS" "$((OP_RSS / 1024))" MB "$PERF" "$OP_CMD"
result consume "$NAIVE_PEER" "peak RSS" "$((NAIVE_RSS / 1024))" MB "$PERF" "$NAIVE_CMD"
result consume "$OURS" "MariaDB statements per event" "$OP_STMTS" stmts/event "$NAIVE_PEER" "$OP_CMD"
result consume "$NAIVE_PEER" "MariaDB statements per event" "$NAIVE_STMTS" stmts/event "" "$NAIVE_CMD"
result consume "$CEIL" "MariaDB statements per event" "$CEIL_STMTS" stmts/event "" "$CEIL_CMD"
result consume "$OURS" "MariaDB CPU per event" "$OP_CPU" µs/event "$CEIL" "$OP_CMD"
result consume "$CEIL" "MariaDB CPU per event" "$CEIL_CPU" µs/event "" "$CEIL_CMD"
rm -f "$OUT_DIR"/.rss "$OUT_DIR"/.perf.txt "$OUT_DIR"/.op.json "$OUT_DIR"/.naive.json "$OUT_DIR"/.ceil.json \
  "$OUT_DIR"/.db0 "$OUT_DIR"/.db1 "$OUT_DIR"/.cpu0 "$OUT_DIR"/.cpu1
SQL -e "DROP DATABASE ${RUN_ID}_b; DROP DATABASE ${RUN_ID}_c; DROP DATABASE ${RUN_ID}_d" || true
"$STACK" kafka-topics --delete --topic "$TOPIC" >/dev/null 2>&1 || true
