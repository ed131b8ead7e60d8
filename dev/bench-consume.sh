#!/usr/bin/env bash
# Consumer throughput on one backlog, three peers in one run, same broker:
#   (a) kafka-consumer-perf-test reading the backlog (the raw ceiling),
#   (b) orderpipe consume: dedup + one handler (notification) on MariaDB,
#       batched per partition,
#   (c) seed 004's algorithm literally: per record begin, INSERT IGNORE,
#       effect, commit, synchronous offset commit (first NAIVE records only:
#       it is slow).
# (b) and (c) also report MariaDB statements per event (global counters
# read before and after each run: run on a quiet server).
#
#   dev/bench-consume.sh [COUNT] [NAIVE]   (defaults 1000000 and 50000; needs `make dev-up`)
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
db_counters "$OUT_DIR/.db0"
ORDERPIPE_DATABASE__URL="$DB_URL_BASE/${RUN_ID}_b" /usr/bin/time -f '%M' -o "$OUT_DIR/.rss" \
  "$BIN" "${OP_ARGS[@]}" > "$OUT_DIR/.op.json"
db_counters "$OUT_DIR/.db1"
OP_RSS=$(cat "$OUT_DIR/.rss")
read -r OP_RATE OP_APPLIED OP_SECS <<<"$(python3 -c '
import json,sys; r=json.load(open(sys.argv[1])); print(r["applied"]/r["active_secs"], r["applied"], r["active_secs"])' "$OUT_DIR/.op.json")"
[ "$OP_APPLIED" = "$COUNT" ] || { echo "orderpipe applied $OP_APPLIED of $COUNT" >&2; exit 1; }
{ read -r OP_STMTS; read -r OP_STMT_MIX; } < <(per_event "$OUT_DIR/.db0" "$OUT_DIR/.db1" "$OP_APPLIED")

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

python3 - "$COUNT" "$NAIVE" "$PERF_RATE" "$OP_RATE" "$NAIVE_RATE" "$PERF_RSS" "$OP_RSS" "$NAIVE_RSS" "$OUT_DIR/consume-$RUN_ID.json" \
  "$OP_STMTS" "$NAIVE_STMTS" "$OP_STMT_MIX" "$NAIVE_STMT_MIX" <<'PY'
import json, sys
count, naive, a, b, c, ra, rb, rc, out, sb, sc, mb, mc = sys.argv[1:]
a, b, c, sb, sc = float(a), float(b), float(c), float(sb), float(sc)
print()
print(f"backlog {count} events, same broker; (c) measured over its first {naive} records")
print(f"{'peer':<62} {'events/s':>10} {'peak RSS':>9} {'stmts/event':>12}")
for name, rate, rss, stmts in [
    ("(a) kafka-consumer-perf-test (fetch only, no decode, no DB)", a, ra, ""),
    ("(b) orderpipe consume: decode + dedup + notification, batched", b, rb, f"{sb:.4f}"),
    ("(c) naive: 1 tx + 1 sync offset commit per record", c, rc, f"{sc:.4f}"),
]:
    print(f"{name:<62} {rate:>10,.0f} {int(rss)/1024:>7.0f}MB {stmts:>12}")
print(f"b/a = {b/a:.3f}   b/c = {b/c:.1f}x")
print(f"MariaDB statements per event by kind: (b) {mb}   (c) {mc}")
json.dump({"count": int(count), "naive_records": int(naive), "perftest_eps": a, "orderpipe_eps": b,
           "naive_eps": c, "b_over_a": b/a, "b_over_c": b/c,
           "rss_kb": {"perftest": int(ra), "orderpipe": int(rb), "naive": int(rc)},
           "statements_per_event": {"orderpipe": sb, "naive": sc},
           "statements_per_event_by_kind": {"orderpipe": mb, "naive": mc}}, open(out, "w"), indent=2)
PY
PERF=kafka-consumer-perf-test OURS="orderpipe consume (notification)" NAIVE_PEER="naive per-record"
PERF_CMD="dev/stack.sh ${PERF_ARGS[*]}"
OP_CMD="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/${RUN_ID}_b orderpipe ${OP_ARGS[*]}"
NAIVE_CMD="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/${RUN_ID}_c orderpipe ${NAIVE_ARGS[*]}"
result consume "$PERF" throughput "$PERF_RATE" events/s "" "$PERF_CMD"
result consume "$OURS" throughput "$OP_RATE" events/s "$NAIVE_PEER" "$OP_CMD"
result consume "$NAIVE_PEER" throughput "$NAIVE_RATE" events/s "$PERF" "$NAIVE_CMD"
result consume "$OURS" "backlog drained in" "$OP_SECS" s "" "$OP_CMD"
result consume "$PERF" "peak RSS" "$((PERF_RSS / 1024))" MB "" "$PERF_CMD"
result consume "$OURS" "peak RSS" "$((OP_RSS / 1024))" MB "$PERF" "$OP_CMD"
result consume "$NAIVE_PEER" "peak RSS" "$((NAIVE_RSS / 1024))" MB "$PERF" "$NAIVE_CMD"
result consume "$OURS" "MariaDB statements per event" "$OP_STMTS" stmts/event "$NAIVE_PEER" "$OP_CMD"
result consume "$NAIVE_PEER" "MariaDB statements per event" "$NAIVE_STMTS" stmts/event "" "$NAIVE_CMD"
rm -f "$OUT_DIR"/.rss "$OUT_DIR"/.perf.txt "$OUT_DIR"/.op.json "$OUT_DIR"/.naive.json "$OUT_DIR"/.db0 "$OUT_DIR"/.db1
SQL -e "DROP DATABASE ${RUN_ID}_b; DROP DATABASE ${RUN_ID}_c" || true
"$STACK" kafka-topics --delete --topic "$TOPIC" >/dev/null 2>&1 || true
