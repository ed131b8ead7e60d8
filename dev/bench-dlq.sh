#!/usr/bin/env bash
# The error tier's numbers, one run, same broker and MariaDB:
#   1. happy-path cost: `orderpipe consume` (notification handler) over one
#      backlog with the tier (retry topic subscribed, failures forwarded) and
#      without it (hidden --without-error-tier), events/s each;
#   2. replay throughput: COUNT events dead-lettered (chaos handler), persisted,
#      then `dlq replay` and the group applying them: dead letters replayed and
#      applied per second;
#   3. the same with the group running, as it does in production: COUNT more
#      dead letters of a second group, whose member is up and assigned when
#      `dlq replay` starts; end to end is from the replay's start until the
#      database holds every replayed event's effect (polled every 0.1 s).
#
#   dev/bench-dlq.sh [COUNT]   (default 100000; needs `make dev-up`)
set -euo pipefail
COUNT="${1:-100000}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
DB="$DB_URL_BASE"
export ORDERPIPE_DLQ__PERSISTER_GROUP="$RUN_ID.persister"
rate() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["applied"]/max(r["active_secs"],1e-9))' "$1"; }
now() { date +%s.%N; }

echo "== backlog: $COUNT events"
"$BIN" topics ensure --group "$RUN_ID-tier,$RUN_ID-replay,$RUN_ID-live" >/dev/null
"$BIN" produce --count "$COUNT" --orders 10000 --seed 1 --output json >/dev/null

echo "== happy path with the error tier"
mkdb "${RUN_ID}_tier"
TIER_ARGS=(consume --group "$RUN_ID-tier" --handler notification --until-idle 5 --output json)
ORDERPIPE_DATABASE__URL="$DB/${RUN_ID}_tier" "$BIN" "${TIER_ARGS[@]}" > "$OUT_DIR/.tier.json"
echo "== happy path without the error tier"
mkdb "${RUN_ID}_plain"
PLAIN_ARGS=(consume --group "$RUN_ID-plain" --handler notification --until-idle 5 --without-error-tier --output json)
ORDERPIPE_DATABASE__URL="$DB/${RUN_ID}_plain" "$BIN" "${PLAIN_ARGS[@]}" > "$OUT_DIR/.plain.json"

echo "== dead-lettering $COUNT events (chaos handler fails every event)"
mkdb "${RUN_ID}_dlq"
export ORDERPIPE_DATABASE__URL="$DB/${RUN_ID}_dlq"
# Every event its own dead letter: bulk replay is measured, not parking.
DEAD_ARGS=(consume --group "$RUN_ID-replay" --handler chaos,notification --ordering none --until-idle 5 --output json)
dead_t0=$(now)
ORDERPIPE_CHAOS__PERMANENT_ALL=true "$BIN" "${DEAD_ARGS[@]}" > "$OUT_DIR/.dead.json"
# Two clocks: the summary's active_secs (first record received to the last
# batch settled, here its dead letters acknowledged: the clock the happy
# path's rows use), and the wall time less the idle wait, which adds the
# process's start and its first group join.
dead_secs=$(python3 -c 'import sys; print(float(sys.argv[2]) - float(sys.argv[1]) - 5)' "$dead_t0" "$(now)")
"$BIN" dlq persist --until-idle 5 --output json > "$OUT_DIR/.persist.json"
echo "== dlq replay --group $RUN_ID-replay"
t0=$(now)
REPLAY_ARGS=(dlq replay --group "$RUN_ID-replay" --yes --output json)
"$BIN" "${REPLAY_ARGS[@]}" > "$OUT_DIR/.replay.json"
t1=$(now)
APPLY_ARGS=(consume --group "$RUN_ID-replay" --handler chaos,notification --until-idle 5 --output json)
"$BIN" "${APPLY_ARGS[@]}" > "$OUT_DIR/.applied.json"

echo "== dlq replay --group $RUN_ID-live, its member running"
mkdb "${RUN_ID}_live"
export ORDERPIPE_DATABASE__URL="$DB/${RUN_ID}_live"
LIVE_DEAD_ARGS=(consume --group "$RUN_ID-live" --handler chaos,notification --ordering none --until-idle 5 --output json)
ORDERPIPE_CHAOS__PERMANENT_ALL=true "$BIN" "${LIVE_DEAD_ARGS[@]}" > /dev/null
"$BIN" dlq persist --until-idle 5 --output json > /dev/null
LIVE_ARGS=(consume --group "$RUN_ID-live" --handler chaos,notification --until-idle 10 --output json)
"$BIN" "${LIVE_ARGS[@]}" > "$OUT_DIR/.live.json" 2> "$OUT_DIR/.live.log" &
live_pid=$!
# The member is assigned before the replay starts, so its join is not timed.
until grep -q 'partitions assigned' "$OUT_DIR/.live.log"; do
  kill -0 "$live_pid" 2>/dev/null || { cat "$OUT_DIR/.live.log" >&2; exit 1; }
  sleep 0.1
done
LIVE_REPLAY_ARGS=(dlq replay --group "$RUN_ID-live" --yes --output json)
# Where the CPU goes over the window: MariaDB's, the member's, and the
# rest of the machine's (the `dlq replay` process, the broker).
db_cpu "$OUT_DIR/.live-db0"; member0=$(proc_cpu "$live_pid"); machine0=$(machine_cpu)
live_t0=$(now)
"$BIN" "${LIVE_REPLAY_ARGS[@]}" > "$OUT_DIR/.live-replay.json"
until [ "$(SQL -e "SELECT COUNT(*) FROM ${RUN_ID}_live.notifications")" -ge "$COUNT" ]; do sleep 0.1; done
live_t1=$(now)
db_cpu "$OUT_DIR/.live-db1"; member1=$(proc_cpu "$live_pid"); machine1=$(machine_cpu)
LIVE_DB_CPU=$(cpu_per_event "$OUT_DIR/.live-db0" "$OUT_DIR/.live-db1" "$COUNT")
read -r LIVE_MEMBER_CPU LIVE_REST_CPU LIVE_IDLE <<<"$(python3 -c '
import sys
n, db, m0, m1, c0, c1, t0, t1 = int(sys.argv[1]), float(sys.argv[2]), *map(float, sys.argv[3:])
member, machine = (m1 - m0) / n, (c1 - c0) / n
cores = len(open("/proc/cpuinfo").read().split("processor")) - 1
print(f"{member:.1f} {machine - db - member:.1f} {100 * (1 - (c1 - c0) / 1e6 / ((t1 - t0) * cores)):.0f}")
' "$COUNT" "$LIVE_DB_CPU" "$member0" "$member1" "$machine0" "$machine1" "$live_t0" "$live_t1")"
wait "$live_pid"
LIVE_RATE=$(python3 -c 'import sys; print(int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])))' "$COUNT" "$live_t0" "$live_t1")
printf '  replayed and applied, member running: %.0f per second end to end (%.1f s)\n' \
  "$LIVE_RATE" "$(python3 -c 'import sys; print(float(sys.argv[2]) - float(sys.argv[1]))' "$live_t0" "$live_t1")"
printf '  CPU per replayed event: MariaDB %s µs, the member %s µs, the rest (dlq replay, the broker) %s µs; idle %s %%\n' \
  "$LIVE_DB_CPU" "$LIVE_MEMBER_CPU" "$LIVE_REST_CPU" "$LIVE_IDLE"

python3 - "$COUNT" "$OUT_DIR" "$t0" "$t1" "$(rate "$OUT_DIR/.tier.json")" "$(rate "$OUT_DIR/.plain.json")" "$OUT_DIR/dlq-$RUN_ID.json" <<'PY'
import json, sys
count, out, t0, t1, tier, plain, result = sys.argv[1:]
count, t0, t1, tier, plain = int(count), float(t0), float(t1), float(tier), float(plain)
load = lambda n: json.load(open(f"{out}/.{n}.json"))
dead, persisted, replay, applied = load("dead"), load("persist"), load("replay"), load("applied")
replay_secs = t1 - t0
apply_secs = applied["active_secs"]
print()
print(f"happy path, {count} events, notification handler on MariaDB:")
print(f"  with the error tier      {tier:>10,.0f} events/s")
print(f"  without the error tier   {plain:>10,.0f} events/s")
print(f"  tier overhead            {100*(1-tier/plain):>10.1f} %  (with/without = {tier/plain:.3f})")
print(f"replay of {replay['replayed']} dead letters (dead-lettered {dead['dead_lettered']}, persisted {persisted['read']}):")
print(f"  dlq replay               {replay['replayed']/replay_secs:>10,.0f} rows/s  ({replay_secs:.1f} s)")
print(f"  group applies them       {applied['applied']/max(apply_secs,1e-9):>10,.0f} events/s ({apply_secs:.1f} s)")
print(f"  replayed and applied     {applied['applied']/(replay_secs+apply_secs):>10,.0f} per second end to end")
json.dump({"count": count, "tier_eps": tier, "plain_eps": plain, "replayed": replay["replayed"],
           "replay_secs": replay_secs, "applied": applied["applied"], "apply_secs": apply_secs}, open(result, "w"), indent=2)
PY
# Rows for target/bench/results.tsv (the report's table).
read -r REPLAY_RATE APPLY_RATE E2E_RATE <<<"$(python3 -c '
import json, sys
replay, applied = (json.load(open(f"{sys.argv[1]}/.{n}.json")) for n in ("replay", "applied"))
secs = float(sys.argv[3]) - float(sys.argv[2])
print(replay["replayed"] / secs, applied["applied"] / max(applied["active_secs"], 1e-9),
      applied["applied"] / (secs + applied["active_secs"]))' "$OUT_DIR" "$t0" "$t1")"
DB_ENV="ORDERPIPE_DATABASE__URL=$DB/${RUN_ID}_dlq"
TIER_CMD="ORDERPIPE_DATABASE__URL=$DB/${RUN_ID}_tier orderpipe ${TIER_ARGS[*]}"
DEAD_CMD="$DB_ENV ORDERPIPE_CHAOS__PERMANENT_ALL=true orderpipe ${DEAD_ARGS[*]}"
REPLAY_CMD="$DB_ENV orderpipe ${REPLAY_ARGS[*]}"
APPLY_CMD="$DB_ENV orderpipe ${APPLY_ARGS[*]}"
result dlq "consume with error tier" throughput "$(rate "$OUT_DIR/.tier.json")" events/s "consume without error tier" "$TIER_CMD"
result dlq "consume without error tier" throughput "$(rate "$OUT_DIR/.plain.json")" events/s "" \
  "ORDERPIPE_DATABASE__URL=$DB/${RUN_ID}_plain orderpipe ${PLAIN_ARGS[*]}"
result dlq "every event dead-lettered" throughput \
  "$(jget "$OUT_DIR/.dead.json" "r['dead_lettered'] / max(r['active_secs'], 1e-9)")" rec/s "consume with error tier" "$DEAD_CMD"
result dlq "every event dead-lettered (wall time less 5 s idle: with start and group join)" throughput \
  "$(jget "$OUT_DIR/.dead.json" "r['dead_lettered'] / max($dead_secs, 1e-9)")" rec/s "" "$DEAD_CMD"
result dlq "dlq replay" throughput "$REPLAY_RATE" rec/s "" "$REPLAY_CMD"
result dlq "replayed records applied" throughput "$APPLY_RATE" rec/s "" "$APPLY_CMD"
result dlq "replay, applied end to end" throughput "$E2E_RATE" rec/s "" "$REPLAY_CMD; $APPLY_CMD"
result dlq "replay, applied end to end, member running" throughput "$LIVE_RATE" rec/s "replay, applied end to end" \
  "ORDERPIPE_DATABASE__URL=$DB/${RUN_ID}_live orderpipe ${LIVE_ARGS[*]} & ORDERPIPE_DATABASE__URL=$DB/${RUN_ID}_live orderpipe ${LIVE_REPLAY_ARGS[*]}"
for cpu in "MariaDB CPU per event:$LIVE_DB_CPU" "member CPU per event:$LIVE_MEMBER_CPU" "other CPU per event (dlq replay, broker):$LIVE_REST_CPU"; do
  result dlq "replay, applied end to end, member running" "${cpu%%:*}" "${cpu##*:}" µs/event "" \
    "ORDERPIPE_DATABASE__URL=$DB/${RUN_ID}_live orderpipe ${LIVE_REPLAY_ARGS[*]}"
done
rm -f "$OUT_DIR"/.live-db0 "$OUT_DIR"/.live-db1 "$OUT_DIR"/.tier.json "$OUT_DIR"/.plain.json "$OUT_DIR"/.dead.json "$OUT_DIR"/.persist.json "$OUT_DIR"/.replay.json "$OUT_DIR"/.applied.json \
  "$OUT_DIR"/.live.json "$OUT_DIR"/.live.log "$OUT_DIR"/.live-replay.json
SQL -e "DROP DATABASE ${RUN_ID}_tier; DROP DATABASE ${RUN_ID}_plain; DROP DATABASE ${RUN_ID}_dlq; DROP DATABASE ${RUN_ID}_live" || true
