#!/usr/bin/env bash
# The relay's numbers, one run, same broker and MariaDB:
#   1. throughput: ROWS outbox rows published with the default settings
#      (`orderpipe relay`, no flags), then the first min(ROWS, 100000) rows
#      again at 50 and 200 rows per Kafka transaction; rows/s each, and each
#      run's time per batch in every pipeline stage (claim, encode, produce,
#      commit, mark: the relay's summary, `stages_ms`);
#   1b. the log-based relay (`relay --source binlog`): the same ROWS rows
#      copied into a database of its own in 1,000-row transactions, read
#      from the binlog as a backlog (catch-up), published and deleted;
#   2. the plain idempotent producer (`orderpipe produce`, no transactions,
#      no database) on the same broker, for the cost of the outbox path;
#      for 1b and 2, each process's CPU per record (orderpipe, mariadbd, the
#      broker) against what the machine's cores allow at the run's rate;
#   3. end-to-end latency from the API's commit to the consumer's commit
#      (dev/bench-latency.sh: RATE orders/s, then 5,000 events/s), with the
#      polling relay and with the log-based one.
#
#   dev/bench-relay.sh [ROWS] [RATE]   (defaults 1000000 and 100; needs `make dev-up`)
set -euo pipefail
ROWS="${1:-1000000}"
RATE="${2:-100}"
SMALL=$(( ROWS < 100000 ? ROWS : 100000 ))
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
export ORDERPIPE_DATABASE__URL="$DB_URL_BASE/${RUN_ID}"
SQL -e "CREATE DATABASE ${RUN_ID}"
"$BIN" migrate >/dev/null
"$BIN" topics ensure --group "$RUN_ID-e2e" >/dev/null

echo "== filling the outbox: 2000 orders through the service, copied up to $ROWS rows"
"$BIN" bench-drive-orders --orders 2000 >/dev/null
while [ "$(SQL -e "SELECT COUNT(*) FROM ${RUN_ID}.outbox_messages")" -lt "$ROWS" ]; do
  SQL -e "INSERT INTO ${RUN_ID}.outbox_messages (event_id, tx_id, shard, topic, message_key, event_name, envelope, created_ms)
          SELECT UUID(), UUID(), shard, topic, message_key, event_name, envelope, created_ms FROM ${RUN_ID}.outbox_messages LIMIT $ROWS"
done
SQL -e "DELETE FROM ${RUN_ID}.outbox_messages WHERE id > (SELECT id FROM (SELECT id FROM ${RUN_ID}.outbox_messages ORDER BY id LIMIT 1 OFFSET $((ROWS - 1))) x)"

: > "$OUT_DIR/.batches"
# The id of the SMALL-th row: the small-batch runs publish rows up to it.
SMALL_LAST=$(SQL -e "SELECT id FROM ${RUN_ID}.outbox_messages ORDER BY id LIMIT 1 OFFSET $((SMALL - 1))")
for run in default 50 200; do
  if [ "$run" = default ]; then
    rows=$ROWS; RELAY_ARGS=(relay --source poll --instance bench-default --until-idle 2 --output json)
    SQL -e "UPDATE ${RUN_ID}.outbox_messages SET sent_ms = NULL"
  else
    rows=$SMALL; RELAY_ARGS=(relay --source poll --instance "bench-$run" --batch-size "$run" --until-idle 2 --output json)
    SQL -e "UPDATE ${RUN_ID}.outbox_messages SET sent_ms = IF(id <= $SMALL_LAST, NULL, 1)"
  fi
  echo "== relay, $rows rows, ${run/default/default settings (500)} rows per Kafka transaction"
  "$BIN" "${RELAY_ARGS[@]}" > "$OUT_DIR/.relay-$run.json"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r["published"], r["active_secs"], r["transactions"])' \
    "$OUT_DIR/.relay-$run.json" "$run" >> "$OUT_DIR/.batches"
  variant="batch $run, $rows rows"; [ "$run" = default ] && variant="default settings (batch 500), $rows rows"
  CMD="ORDERPIPE_DATABASE__URL=$ORDERPIPE_DATABASE__URL orderpipe ${RELAY_ARGS[*]}"
  result relay "$variant" throughput "$(jget "$OUT_DIR/.relay-$run.json" 'r["published"] / max(r["active_secs"], 1e-9)')" rec/s \
    "plain producer" "$CMD"
  for p in p50 p99; do
    result relay "$variant" "Kafka commit $p" "$(jget "$OUT_DIR/.relay-$run.json" "r['stages_ms']['commit']['$p']")" ms "" "$CMD"
  done
done

echo "== log-based relay, $ROWS rows: copied in 1,000-row transactions, then read from the binlog"
LOGDB="${RUN_ID}log"
SQL -e "CREATE DATABASE $LOGDB"
ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$LOGDB" "$BIN" migrate >/dev/null
START=$(SQL -e "SHOW MASTER STATUS" | awk '{print $1 ":" $2}')
LO=0
while :; do
  HI=$(SQL -e "SELECT MAX(id) FROM (SELECT id FROM ${RUN_ID}.outbox_messages WHERE id > $LO ORDER BY id LIMIT 1000) x")
  [ "$HI" = NULL ] && break
  echo "INSERT INTO $LOGDB.outbox_messages (event_id, tx_id, shard, topic, message_key, event_name, envelope, created_ms) SELECT event_id, tx_id, shard, topic, message_key, event_name, envelope, created_ms FROM ${RUN_ID}.outbox_messages WHERE id > $LO AND id <= $HI;"
  LO=$HI
done | SQL
export ORDERPIPE_OUTBOX__BINLOG_NAME="$RUN_ID-outbox" ORDERPIPE_OUTBOX__OFFSETS_TOPIC="$RUN_ID.outbox.offsets"
RELAY_ARGS=(relay --source binlog --instance bench-binlog --start-position "$START" --until-idle 3 --output json)
# Each process's CPU over the run, for where the time goes (printed below).
cpu_before() { db_cpu "$OUT_DIR/.db0"; broker_cpu "$OUT_DIR/.broker0"; }
cpu_after() { db_cpu "$OUT_DIR/.db1"; broker_cpu "$OUT_DIR/.broker1"
  echo "$1 $(cat "$OUT_DIR/.own-cpu") $(( $(cat "$OUT_DIR/.db1") - $(cat "$OUT_DIR/.db0") )) $(( $(cat "$OUT_DIR/.broker1") - $(cat "$OUT_DIR/.broker0") ))" >> "$OUT_DIR/.cpu"; }
: > "$OUT_DIR/.cpu"
cpu_before
/usr/bin/time -f '%U %S' -o "$OUT_DIR/.own-cpu" env ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$LOGDB" "$BIN" "${RELAY_ARGS[@]}" > "$OUT_DIR/.relay-binlog.json"
cpu_after binlog
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("binlog", r["published"], r["active_secs"], r["transactions"])' \
  "$OUT_DIR/.relay-binlog.json" >> "$OUT_DIR/.batches"
result relay "log-based (binlog), $ROWS rows" throughput "$(jget "$OUT_DIR/.relay-binlog.json" 'r["published"] / max(r["active_secs"], 1e-9)')" rec/s \
  "plain producer" "ORDERPIPE_DATABASE__URL=.../$LOGDB orderpipe ${RELAY_ARGS[*]}"
echo "   left in the table after the relay's deletes: $(SQL -e "SELECT COUNT(*) FROM $LOGDB.outbox_messages") rows"
SQL -e "DROP DATABASE $LOGDB" || true

echo "== plain idempotent producer, $ROWS events"
PRODUCE_ARGS=(produce --count "$ROWS" --orders 10000 --seed 1 --output json)
cpu_before
/usr/bin/time -f '%U %S' -o "$OUT_DIR/.own-cpu" "$BIN" "${PRODUCE_ARGS[@]}" > "$OUT_DIR/.produce.json"
cpu_after produce
result relay "plain producer" throughput "$(jget "$OUT_DIR/.produce.json" 'r["events_per_sec"]')" rec/s "" "orderpipe ${PRODUCE_ARGS[*]}"

python3 - "$OUT_DIR" "$ROWS" "$RATE" "$OUT_DIR/relay-$RUN_ID.json" "$RESULTS" <<'PY'
import json, os, sys
out, rows, rate, result, results = sys.argv[1:]
batches = [l.split() for l in open(f"{out}/.batches")]
produce = json.load(open(f"{out}/.produce.json"))
print()
print(f"relay, outbox rows (order + inventory events), transactional, same broker:")
print(f"{'rows per transaction':>22} {'rows':>9} {'rows/s':>10} {'transactions':>13}")
best = 0
for batch, published, secs, txs in batches:
    r = int(published) / max(float(secs), 1e-9)
    best = max(best, r)
    print(f"{batch:>22} {published:>9} {r:>10,.0f} {txs:>13}")
print()
print("where a batch's time goes, per stage (ms per batch, p50 / p99; the stages overlap: claim and")
print("encode of the next batch run during produce + commit, mark during the next batch's produce):")
stages = ["claim", "encode", "produce", "commit", "mark"]
print(f"{'rows per transaction':>22} " + " ".join(f"{s:>15}" for s in stages))
for batch, *_ in batches:
    st = json.load(open(f"{out}/.relay-{batch}.json")).get("stages_ms", {})
    cell = lambda s: f"{st[s]['p50']:.1f} / {st[s]['p99']:.1f}" if s in st else "-"
    print(f"{batch:>22} " + " ".join(f"{cell(s):>15}" for s in stages))
print(f"plain idempotent producer (orderpipe produce, no DB, no transactions): {produce['events_per_sec']:,.0f} events/s")
print(f"best relay / plain producer: {best / produce['events_per_sec']:.2f}")
# Where the log relay's time goes against the producer's: each process's CPU
# per record (user + system over the whole run: the start, the idle wait and
# the deletes that trail the last publish included), against what the
# machine's cores allow per record at the run's rate.
published, secs = next(((int(p), float(s)) for b, p, s, _ in batches if b == "binlog"), (0, 0.0))
# name: (records, rate, results variant, printed label, peer)
runs = {"binlog": (published, published / max(secs, 1e-9), f"log-based (binlog), {rows} rows",
                   "log-based relay", "plain producer"),
        "produce": (int(rows), produce["events_per_sec"], "plain producer", "plain idempotent producer", "")}
print()
cores = os.cpu_count()
print(f"CPU per record by process (µs, user + system over the whole run), and what {cores} cores allow per record at the run's rate:")
print(f"{'':>28} {'orderpipe':>10} {'mariadbd':>10} {'broker':>10} {'together':>10} {'allowed':>8}")
cpu_rows = {}
for line in open(f"{out}/.cpu"):
    name, user, system, db, broker = line.split()
    count, rate, variant, label, peer = runs[name]
    n = max(count, 1)
    per = [(float(user) + float(system)) * 1e6 / n, int(db) / n, int(broker) / n]
    cpu_rows[name] = per
    with open(results, "a") as f:
        for what, v in zip(["orderpipe", "mariadbd", "the broker", "all three"], per + [sum(per)]):
            f.write(f"relay\t{variant}\tCPU per record: {what}\t{v:.1f}\tµs\t{peer}\tdev/bench-relay.sh {rows}\n")
    print(f"{label:>28} " + " ".join(f"{v:>10.1f}" for v in per) + f" {sum(per):>10.1f} {cores * 1e6 / max(rate, 1e-9):>8.1f}")
json.dump({"batches": batches, "produce_eps": produce["events_per_sec"], "cpu_us_per_record": cpu_rows}, open(result, "w"), indent=2)
PY
rm -f "$OUT_DIR"/.batches "$OUT_DIR"/.relay-*.json "$OUT_DIR"/.produce.json "$OUT_DIR"/.cpu "$OUT_DIR"/.own-cpu "$OUT_DIR"/.db[01] "$OUT_DIR"/.broker[01]
SQL -e "DROP DATABASE ${RUN_ID}" || true

# 3. End to end, API commit -> consumer commit, both stamped after their commits:
#    the polling relay, then the log-based one (runs low-binlog, high-binlog;
#    the report's CDF draws all four).
"$ROOT/dev/bench-latency.sh" "$RATE"
SOURCE=binlog "$ROOT/dev/bench-latency.sh" "$RATE"
