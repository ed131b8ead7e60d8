#!/usr/bin/env bash
# HTTP delivery's concurrency per partition: one `orderpipe deliver` over
# one backlog of COUNT events (ORDERS orders at a time, 12 partitions)
# against a local endpoint answering `204` after 50 ms
# (dev/bench-delivery-endpoint.py), with `in_flight = 16` and with
# `in_flight = 1` (one POST at a time per partition, the path before),
# same records, side by side: deliveries/s of each, their ratio, and the
# per-key order check done at the endpoint: per record key, the order the
# requests arrived in against the records' offsets (from the group's dedup
# rows), and every event delivered exactly once.
#
#   dev/bench-delivery.sh [COUNT] [DELAY_MS]   (default 12000 and 50; needs `make dev-up`)
set -euo pipefail
COUNT="${1:-12000}"
DELAY_MS="${2:-50}"
ORDERS=2000
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
LOG="$OUT_DIR/.delivery-endpoint-$RUN_ID.log"
PORT_FILE="$OUT_DIR/.delivery-endpoint-$RUN_ID.port"
python3 "$ROOT/dev/bench-delivery-endpoint.py" "$DELAY_MS" "$LOG" > "$PORT_FILE" &
ENDPOINT=$!
trap 'kill $ENDPOINT 2>/dev/null || true; drop_topics' EXIT
for _ in $(seq 50); do [ -s "$PORT_FILE" ] && break; sleep 0.1; done
PORT="$(head -1 "$PORT_FILE")"
CONFIG="$OUT_DIR/.delivery-$RUN_ID.toml"
: > "$CONFIG"
for n in 16 1; do
  cat >> "$CONFIG" <<TOML
[[http.subscriptions]]
name = "${RUN_ID}-if$n"
events = ["order.*"]
url = "http://127.0.0.1:$PORT/if$n"
in_flight = $n

TOML
done
echo "== backlog: $COUNT events of $ORDERS orders at a time; endpoint answers after $DELAY_MS ms"
"$BIN" --config "$CONFIG" topics ensure >/dev/null
"$BIN" produce --count "$COUNT" --orders "$ORDERS" --seed 7 --first-order-id 1 --output json >/dev/null
RUNS="$OUT_DIR/.delivery-runs-$RUN_ID.jsonl"
: > "$RUNS"
for n in 16 1; do
  db="${RUN_ID}_if$n"
  mkdb "$db"
  echo "== in_flight = $n"
  ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$db" "$BIN" --log-level off --config "$CONFIG" \
    deliver --subscription "${RUN_ID}-if$n" --until-idle 5 --output json > "$OUT_DIR/.run.json"
  SQL "$db" -e "SELECT event_id, record_key, kafka_partition, kafka_offset FROM applied_events" > "$OUT_DIR/.dedup.tsv"
  python3 - "$n" "$OUT_DIR/.run.json" "$OUT_DIR/.dedup.tsv" "$LOG" >> "$RUNS" <<'PY'
import json, sys
n, run, dedup, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
r = json.load(open(run))
where = {}
for line in open(dedup):
    event_id, key, partition, offset = line.rstrip("\n").split("\t")
    where[event_id] = (key, int(partition), int(offset))
seen, last, out_of_order, repeated, unknown = set(), {}, set(), 0, 0
for line in open(log):
    path, _, request_id = line.rstrip("\n").split("\t")
    if path != f"/if{n}":
        continue
    if request_id in seen:
        repeated += 1
        continue
    seen.add(request_id)
    if request_id not in where:
        unknown += 1
        continue
    key, partition, offset = where[request_id]
    if last.get(key, (partition, -1))[1] >= offset:
        out_of_order.add(key)
    last[key] = (partition, offset)
print(json.dumps({"in_flight": int(n), "applied": r["handlers"]["http"]["applied"],
                  "secs": r["active_secs"], "per_sec": r["handlers"]["http"]["applied"] / max(r["active_secs"], 1e-9),
                  "delivered": len(seen), "repeated": repeated, "undeduped": unknown,
                  "keys": len(last), "keys_out_of_order": len(out_of_order)}))
PY
  SQL -e "DROP DATABASE $db" || true
done
COMMAND="orderpipe --config CONFIG deliver --subscription ${RUN_ID}-if{n} --until-idle 5 --output json \
(CONFIG: [[http.subscriptions]] url = local endpoint answering 204 after $DELAY_MS ms, in_flight = {n}; \
backlog: orderpipe produce --count $COUNT --orders $ORDERS --seed 7 --first-order-id 1; binary $BIN)"
python3 - "$COUNT" "$DELAY_MS" "$RUNS" "$RESULTS" "$COMMAND" <<'PY'
import json, sys
count, delay, runs, tsv, command = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
rows = {r["in_flight"]: r for r in map(json.loads, open(runs))}
print()
print(f"{count} events, 12 partitions, endpoint answering after {delay} ms")
print()
head = f"{'in_flight':>9} {'deliveries/s':>13} {'secs':>7} {'delivered':>10} {'repeated':>9} {'keys':>6} {'keys out of order':>18}"
print(head)
print("-" * len(head))
for n in (16, 1):
    r = rows[n]
    print(f"{n:>9} {r['per_sec']:>13,.0f} {r['secs']:>7.1f} {r['delivered']:>10} {r['repeated']:>9} {r['keys']:>6} {r['keys_out_of_order']:>18}")
ratio = rows[16]["per_sec"] / rows[1]["per_sec"]
print(f"\nin_flight 16 / in_flight 1: {ratio:.2f}x")
with open(tsv, "a") as f:
    for n in (16, 1):
        r = rows[n]
        cmd = command.format(n=n)
        f.write("\t".join(["delivery", f"in_flight {n}", "throughput", repr(r["per_sec"]), "deliveries/s",
                           "in_flight 1" if n == 16 else "", cmd]) + "\n")
        f.write("\t".join(["delivery", f"in_flight {n}", "keys delivered out of order", str(r["keys_out_of_order"]),
                           "keys", "", cmd]) + "\n")
PY
rm -f "$RUNS" "$OUT_DIR/.run.json" "$OUT_DIR/.dedup.tsv" "$LOG" "$PORT_FILE" "$CONFIG"
