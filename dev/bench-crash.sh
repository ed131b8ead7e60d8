#!/usr/bin/env bash
# Crash safety at full size (issue 13): two `orderpipe consume` members of
# one group (every business handler) over a backlog of COUNT events, SIGKILLed
# KILLS times, alternately, spread over the run (kill k once (k+1)/(KILLS+2)
# of the events are applied, plus up to 0.7 s), each restarted at once. Then
# `orderpipe bench-order-check`: every event has exactly one dedup row (it
# commits in the transaction of the event's effects) and every order's events
# were applied in production order; anything else fails the script.
# Rows: the run's wall time and events/s, the rebalances after the kills
# included (each waits for the killed member's session, 10 s, to expire),
# and the check. Measured 2026-12-01 with the release build on this 2-core
# machine while other tests ran: 1M applied 305 s after the members started
# (3,274 events/s); 7.5 min in all with producing and the check.
#
#   dev/bench-crash.sh [COUNT] [KILLS]   (default 1000000 20; needs `make dev-up`)
#
# `make test` runs the same scenario on 100,000 events with the debug build
# (tests/it/crash.rs, which also checks every business table).
set -euo pipefail
COUNT="${1:-1000000}"
KILLS="${2:-20}"
ORDERS=20000
SEED=13
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
HANDLERS="inventory,payment,logistics,notification,points"
GROUP="${RUN_ID}_crash"
pids=()
stop_members() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  drop_topics
}
trap stop_members EXIT

mkdb "$GROUP"
export ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$GROUP"
"$BIN" topics ensure --group "$GROUP" >/dev/null
echo "== backlog: $COUNT events of $ORDERS orders at a time"
"$BIN" produce --count "$COUNT" --orders "$ORDERS" --seed "$SEED" --first-order-id 1 --output json >/dev/null
applied() { SQL -e "SELECT COUNT(*) FROM \`$GROUP\`.applied_events WHERE consumer_group = '$GROUP'"; }
start_member() {
  "$BIN" --log-level off consume --group "$GROUP" --handler "$HANDLERS" >/dev/null 2>&1 &
  pids[$1]=$!
}
started=$(date +%s.%N)
elapsed() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$started"; }
# wait_for N: until N events are applied (fails after 10 min without reaching it).
wait_for() {
  local deadline=$(($(date +%s) + 600))
  until [ "$(applied)" -ge "$1" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "only $(applied) of $1 applied after 10 min" >&2; exit 1; }
    sleep 1
  done
}

echo "== two members, $KILLS SIGKILLs"
start_member 0
start_member 1
for ((k = 0; k < KILLS; k++)); do
  wait_for $((COUNT * (k + 1) / (KILLS + 2)))
  sleep "0.$((RANDOM % 7))"
  victim=$((k % 2))
  kill -KILL "${pids[$victim]}"
  wait "${pids[$victim]}" 2>/dev/null || true
  n=$(applied)
  [ "$n" -lt "$COUNT" ] || { echo "the run finished before kill $((k + 1)) of $KILLS" >&2; exit 1; }
  echo "kill $((k + 1)) (member $victim) at $(elapsed) s: $n of $COUNT applied"
  start_member "$victim"
done
wait_for "$COUNT"
secs=$(elapsed)
echo "all $COUNT applied $secs s after the members started"
for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
pids=()

check=$("$BIN" bench-order-check --group "$GROUP" --count "$COUNT" --orders "$ORDERS" --seed "$SEED" --first-order-id 1)
echo "check: $check"
COMMAND="dev/bench-crash.sh $COUNT $KILLS (orderpipe consume --group $GROUP --handler $HANDLERS, two members, \
SIGKILLed alternately and restarted; backlog: orderpipe produce --count $COUNT --orders $ORDERS --seed $SEED --first-order-id 1; \
check: orderpipe bench-order-check --group $GROUP --count $COUNT --orders $ORDERS --seed $SEED --first-order-id 1)"
VARIANT="2 members, $KILLS SIGKILLs"
python3 - "$check" "$COUNT" "$secs" "$VARIANT" "$COMMAND" "$RESULTS" <<'PY'
import json, sys
check, count, secs, variant, command, tsv = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), *sys.argv[4:]
rows = [
    ("wall time", f"{secs:.1f}", "s"),
    ("throughput, the rebalances after the kills included", f"{count / secs:.0f}", "events/s"),
    ("events without exactly one dedup row", str(check["produced"] - check["applied"]), "events"),
    ("orders applied out of order", str(check["orders_out_of_order"]), "orders"),
]
with open(tsv, "a") as f:
    for metric, value, unit in rows:
        f.write("\t".join(["crash", variant, metric, value, unit, "", command]) + "\n")
ok = check["applied"] == check["produced"] == count and check["orders_out_of_order"] == 0
print(f"{count} events, {variant}: {secs:.1f} s ({count / secs:.0f} events/s), "
      + ("every event applied once, every order in order" if ok else f"CHECK FAILED: {check}"))
sys.exit(0 if ok else 1)
PY
SQL -e "DROP DATABASE \`$GROUP\`" || true
