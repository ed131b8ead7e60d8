#!/usr/bin/env bash
# Per-key ordering's price, one run, same broker and MariaDB: `orderpipe
# consume` (chaos + every business handler) over one backlog of COUNT events,
# in mode `key` and mode `none`, with 0 %, 1 % and 5 % of the events failing
# once (transiently; no local retries, so each goes through the retry topic,
# due after 200 ms). The same events fail in every run (picked by event id).
# Each pair runs twice in the order key, none, none, key (so drift of the
# shared machine cancels out) and the two runs are averaged. Per mode:
# events applied per second, records retried / held / dead-lettered,
# orders applied out of production order, and MariaDB statements per event
# (the server's Com_* counters; nothing else runs on it meanwhile), which
# shows the parked-key check's DB cost on the happy path.
#
#   dev/bench-ordering.sh [COUNT]   (default 100000; needs `make dev-up`)
set -euo pipefail
COUNT="${1:-100000}"
ORDERS=10000
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
HANDLERS="chaos,inventory,payment,logistics,notification,points"
statements() { SQL -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_select','Com_insert','Com_insert_select','Com_update','Com_update_multi','Com_delete','Com_delete_multi')" | awk '{printf "%s=%s ", $1, $2}'; }

echo "== backlog: $COUNT events of $ORDERS orders at a time"
"$BIN" topics ensure >/dev/null
"$BIN" produce --count "$COUNT" --orders "$ORDERS" --seed 7 --first-order-id 1 --output json >/dev/null
RUN=0
RUNS="$OUT_DIR/.ordering-runs.jsonl"
: > "$RUNS"
for rate in 0 0.01 0.05; do
  for mode in key none none key; do
    name="${RUN_ID}_${mode}_${rate/./}_$((++RUN))"
    mkdb "$name"
    "$BIN" topics ensure --group "$name" >/dev/null
    echo "== mode $mode, ${rate} of the events failing once"
    before=$(statements)
    ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$name" ORDERPIPE_CHAOS__TRANSIENT_RATE="$rate" ORDERPIPE_CHAOS__TRANSIENT_FAILURES=1 \
      ORDERPIPE_RETRY__LOCAL_RETRIES=0 ORDERPIPE_RETRY__INITIAL_DELAY_MS=200 \
      "$BIN" --log-level off consume --group "$name" --handler "$HANDLERS" --ordering "$mode" --until-idle 5 --output json > "$OUT_DIR/.run.json"
    after=$(statements)
    check=$(ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$name" "$BIN" bench-order-check --group "$name" \
      --count "$COUNT" --orders "$ORDERS" --seed 7 --first-order-id 1)
    python3 - "$mode" "$rate" "$before" "$after" "$check" "$OUT_DIR/.run.json" >> "$RUNS" <<'PY'
import json, sys
mode, rate, before, after, check, run = sys.argv[1:]
parse = lambda s: {k: int(v) for k, v in (kv.split("=") for kv in s.split())}
b, a = parse(before), parse(after)
r = json.load(open(run))
print(json.dumps({"mode": mode, "rate": float(rate), "summary": r, "check": json.loads(check),
                  "statements": {k: a[k] - b[k] for k in a}}))
PY
    SQL -e "DROP DATABASE $name" || true
  done
done
# The command behind each row of target/bench/results.tsv ({mode}, {rate}: the row's).
COMMAND="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/${RUN_ID}_{mode}_{rate}_N ORDERPIPE_CHAOS__TRANSIENT_RATE={rate} \
ORDERPIPE_CHAOS__TRANSIENT_FAILURES=1 ORDERPIPE_RETRY__LOCAL_RETRIES=0 ORDERPIPE_RETRY__INITIAL_DELAY_MS=200 \
orderpipe --log-level off consume --group ${RUN_ID}_{mode}_{rate}_N --handler $HANDLERS --ordering {mode} --until-idle 5 \
--output json (mean of 2 runs, N = run number; backlog: orderpipe produce --count $COUNT --orders $ORDERS --seed 7 --first-order-id 1)"
python3 - "$COUNT" "$RUNS" "$OUT_DIR/ordering-$RUN_ID.json" "$RESULTS" "$COMMAND" <<'PY'
import json, sys
count, results, out, tsv, command = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
runs = [json.loads(l) for l in open(results)]
for r in runs:
    r["events_per_sec"] = r["summary"]["applied"] / max(r["summary"]["active_secs"], 1e-9)
groups = {}
for r in runs:
    groups.setdefault((r["rate"], r["mode"]), []).append(r)
mean = lambda xs: sum(xs) / len(xs)
print()
print(f"{count} events, chaos + 5 business handlers on MariaDB, failing events retried once via the retry topic (200 ms);")
print("each row: mean of 2 runs (order key, none, none, key), the two runs' events/s in brackets")
print()
head = (f"{'failing':>8} {'mode':>5} {'events/s':>9} {'(runs)':>15} {'key/none':>9} {'retried':>8} {'held':>6} "
        f"{'dead':>5} {'out of order':>13} {'SELECT/ev':>10} {'stmts/ev':>9}")
print(head)
print("-" * len(head))
table = []
for (rate, mode), rs in groups.items():
    s = [r["summary"] for r in rs]
    row = {"rate": rate, "mode": mode, "events_per_sec": mean([r["events_per_sec"] for r in rs]),
           "runs_events_per_sec": [r["events_per_sec"] for r in rs],
           "retried": mean([x["sent_to_retry"] for x in s]), "held": mean([x["held"] for x in s]),
           "dead_lettered": mean([x["dead_lettered"] for x in s]),
           "out_of_order": mean([r["check"]["orders_out_of_order"] for r in rs]),
           "select_per_event": mean([r["statements"]["Com_select"] for r in rs]) / count,
           "statements_per_event": mean([sum(r["statements"].values()) for r in rs]) / count}
    table.append(row)
for row in table:
    other = next(o for o in table if o["rate"] == row["rate"] and o["mode"] == "none")
    ratio = f"{row['events_per_sec'] / other['events_per_sec']:.3f}" if row["mode"] == "key" else ""
    row["key_over_none"] = ratio
    each = " / ".join(f"{x:,.0f}" for x in row["runs_events_per_sec"])
    print(f"{row['rate']*100:>7.0f}% {row['mode']:>5} {row['events_per_sec']:>9,.0f} {'(' + each + ')':>15} {ratio:>9} "
          f"{row['retried']:>8.0f} {row['held']:>6.0f} {row['dead_lettered']:>5.0f} {row['out_of_order']:>13.0f} "
          f"{row['select_per_event']:>10.3f} {row['statements_per_event']:>9.3f}")
json.dump({"table": table, "runs": runs}, open(out, "w"), indent=2)
# Rows for the report: key at 1 and 5 % against key at 0 % (what failures
# cost), key at 0 % against none at 0 % (what ordering costs).
variant = lambda row: f"{row['mode']} {row['rate'] * 100:g}%"
with open(tsv, "a") as f:
    for row in table:
        peer = f"{row['mode']} 0%" if row["rate"] else ("none 0%" if row["mode"] == "key" else "")
        cmd = command.format(mode=row["mode"], rate=row["rate"])
        for metric, value, unit, peer_of_metric in [
            ("throughput", row["events_per_sec"], "events/s", peer),
            ("MariaDB statements per event", row["statements_per_event"], "stmts/event",
             f"none {row['rate'] * 100:g}%" if row["mode"] == "key" else ""),
            ("orders applied out of order", row["out_of_order"], "orders", ""),
        ]:
            f.write("\t".join([ "ordering", variant(row), metric, repr(value), unit, peer_of_metric, cmd]) + "\n")
print(f"\nresults: {out}")
PY
rm -f "$RUNS" "$OUT_DIR/.run.json"
