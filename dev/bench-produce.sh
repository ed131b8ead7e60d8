#!/usr/bin/env bash
# Producer throughput: `orderpipe produce` (synthetic lifecycles, Avro via the
# registry, keyed, idempotent) against Kafka's own ProducerPerformance with the
# same record size and producer settings, on the same broker, in one run.
# Same record size means the same bytes per record: perf-test's
# --record-size is orderpipe's average key + header (names and values) +
# value bytes, as orderpipe's run reports them; perf-test sends no key and
# no headers, so all of its bytes are value.
#
#   dev/bench-produce.sh [COUNT]      (default 1000000; needs `make dev-up`)
#
# Prints a table, writes bench-results/produce-<time>.json and appends its
# rows to target/bench/results.tsv (bench-common.sh).
set -euo pipefail
COUNT="${1:-1000000}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
# The producer settings both peers run with (orderpipe's defaults).
PROPS="acks=all enable.idempotence=true max.in.flight.requests.per.connection=5 compression.type=lz4 linger.ms=5"

PERF_TOPIC="$RUN_ID.perftest"

echo "== creating topics (12 partitions each)"
"$BIN" topics ensure >/dev/null
"$STACK" kafka-topics --create --topic "$PERF_TOPIC" --partitions 12 --replication-factor 1 >/dev/null

echo "== orderpipe produce --count $COUNT"
OP_ARGS=(produce --count "$COUNT" --orders 10000 --seed 1 --output json)
/usr/bin/time -f '%M' -o "$OUT_DIR/.rss" "$BIN" "${OP_ARGS[@]}" > "$OUT_DIR/.orderpipe.json"
OP_RSS_KB=$(cat "$OUT_DIR/.rss")
read -r OP_RATE OP_BYTES OP_KH_BYTES OP_ACKED <<<"$(python3 -c '
import json,sys; r=json.load(open(sys.argv[1]))
print(r["events_per_sec"], r["value_bytes"], r["key_header_bytes"], r["acknowledged"])' "$OUT_DIR/.orderpipe.json")"
VALUE_SIZE=$(( OP_BYTES / OP_ACKED ))
RECORD_SIZE=$(( (OP_BYTES + OP_KH_BYTES) / OP_ACKED ))

echo "== kafka-producer-perf-test --num-records $COUNT --record-size $RECORD_SIZE"
PERF_ARGS=(kafka-class org.apache.kafka.tools.ProducerPerformance
  --topic "$PERF_TOPIC" --num-records "$COUNT" --record-size "$RECORD_SIZE" --throughput -1
  --producer-props bootstrap.servers="$BOOTSTRAP" $PROPS)
/usr/bin/time -f '%M' -o "$OUT_DIR/.rss" "$STACK" "${PERF_ARGS[@]}" | tee "$OUT_DIR/.perf.txt" | tail -1
PERF_RSS_KB=$(cat "$OUT_DIR/.rss")
PERF_RATE=$(tail -1 "$OUT_DIR/.perf.txt" | sed -E 's/.* ([0-9.]+) records\/sec.*/\1/')

python3 - "$OP_RATE" "$PERF_RATE" "$RECORD_SIZE" "$VALUE_SIZE" "$COUNT" "$OP_RSS_KB" "$PERF_RSS_KB" "$OUT_DIR/produce-$RUN_ID.json" <<'PY'
import json, sys
op, perf, size, value_size, count, op_rss, perf_rss, out = sys.argv[1:]
op, perf, size, value_size = float(op), float(perf), int(size), int(value_size)
rows = [
    ("orderpipe produce (Avro+registry, keyed, idempotent)", op, int(op_rss)),
    ("kafka-producer-perf-test (raw bytes, same settings)", perf, int(perf_rss)),
]
print()
print(f"{count} records of ~{size} B each (key + headers + value; orderpipe's value alone ~{value_size} B),"
      " acks=all, idempotent, lz4, linger.ms=5, same broker")
print(f"{'peer':<56} {'records/s':>12} {'MB/s':>8} {'peak RSS':>10}")
for name, rate, rss in rows:
    print(f"{name:<56} {rate:>12,.0f} {rate*size/1e6:>8.1f} {rss/1024:>8.0f}MB")
print(f"ratio orderpipe / perf-test: {op/perf:.2f}")
json.dump({"count": int(count), "record_size": size, "value_size": value_size, "orderpipe_rps": op,
           "perftest_rps": perf, "ratio": op/perf,
           "orderpipe_rss_kb": int(op_rss), "perftest_rss_kb": int(perf_rss)}, open(out, "w"), indent=2)
PY
OP_CMD="orderpipe ${OP_ARGS[*]}"
PERF_CMD="dev/stack.sh ${PERF_ARGS[*]}"
PERF=kafka-producer-perf-test
result produce "orderpipe produce" throughput "$OP_RATE" rec/s "$PERF" "$OP_CMD (records of $RECORD_SIZE B: key + headers + value)"
result produce "$PERF" throughput "$PERF_RATE" rec/s "" "$PERF_CMD (--record-size = orderpipe's key + headers + value bytes)"
result produce "orderpipe produce" "peak RSS" "$((OP_RSS_KB / 1024))" MB "$PERF" "$OP_CMD"
result produce "$PERF" "peak RSS" "$((PERF_RSS_KB / 1024))" MB "" "$PERF_CMD"
rm -f "$OUT_DIR"/.rss "$OUT_DIR"/.orderpipe.json "$OUT_DIR"/.perf.txt
"$STACK" kafka-topics --delete --topic "$PERF_TOPIC" >/dev/null 2>&1 || true
for t in "$ORDERPIPE_TOPICS__ORDER_EVENTS__NAME" "$ORDERPIPE_TOPICS__INVENTORY_EVENTS__NAME" "$ORDERPIPE_TOPICS__DEAD_LETTER__NAME"; do
  "$STACK" kafka-topics --delete --topic "$t" >/dev/null 2>&1 || true
done
