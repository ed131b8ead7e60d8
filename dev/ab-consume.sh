#!/usr/bin/env bash
# Two or more consumer builds (or settings) alternated on one backlog:
# each `orderpipe consume --handler notification` reads the whole backlog
# with a fresh group and database, round after round, and prints its
# events/s, peak RSS, its CPU (user + system) per event and MariaDB's CPU
# per event over the run (dev/bench-common.sh's db_cpu). Alternating rounds
# spread the machine's drift over every build, which one run each cannot.
#
#   dev/ab-consume.sh COUNT ROUNDS BIN [BIN ...]   (needs `make dev-up`)
#
# A BIN may be a script that sets ORDERPIPE_* settings and execs a binary.
# AB_DEAD_LETTER=1: every event fails for good and is dead-lettered instead
# (`bench-dlq`'s dead-lettering command: chaos handler, ordering none).
# AB_FAILING=RATE: `bench-ordering`'s command instead: chaos + the five
# business handlers, mode key, RATE of the events failing once (no local
# retries, the retry topic due after 200 ms).
# Rates: first record to last batch settled, and wall time less the 5 s idle
# wait (the start, the group join and the stop added).
set -euo pipefail
(( $# >= 3 )) || { echo "usage: dev/ab-consume.sh COUNT ROUNDS BIN [BIN ...]" >&2; exit 2; }
COUNT=$1; ROUNDS=$2; shift 2
ORDERPIPE_BIN=$1 source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
"$1" topics ensure --group "$RUN_ID-backlog" >/dev/null
"$1" produce --count "$COUNT" --orders 10000 --seed 1 --output json >/dev/null
if [[ "${AB_DEAD_LETTER:-0}" == 1 ]]; then
  ARGS=(--handler chaos,notification --ordering none); export ORDERPIPE_CHAOS__PERMANENT_ALL=true
elif [[ -n "${AB_FAILING:-}" ]]; then
  ARGS=(--handler chaos,inventory,payment,logistics,notification,points --ordering key)
  export ORDERPIPE_CHAOS__TRANSIENT_RATE="$AB_FAILING" ORDERPIPE_CHAOS__TRANSIENT_FAILURES=1 \
    ORDERPIPE_RETRY__LOCAL_RETRIES=0 ORDERPIPE_RETRY__INITIAL_DELAY_MS=200
else
  ARGS=(--handler notification)
fi
printf '%-3s %-28s %10s %10s %8s %12s %12s\n' run build events/s 'wall-5 /s' 'RSS MB' 'CPU us/ev' 'MariaDB us/ev'
n=0
for round in $(seq 1 "$ROUNDS"); do
  for bin in "$@"; do
    n=$((n + 1)); db="${RUN_ID}_ab$n"; group="$RUN_ID-ab$n"
    mkdb "$db"
    "$bin" topics ensure --group "$group" >/dev/null
    db_cpu "$OUT_DIR/.ab.db0"
    ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$db" /usr/bin/time -f '%M %U %S %e' -o "$OUT_DIR/.ab.time" \
      "$bin" consume --group "$group" "${ARGS[@]}" --until-idle 5 --output json \
      > "$OUT_DIR/.ab.json"
    db_cpu "$OUT_DIR/.ab.db1"
    read -r rss user sys wall < "$OUT_DIR/.ab.time"
    db_us=$(( $(cat "$OUT_DIR/.ab.db1") - $(cat "$OUT_DIR/.ab.db0") ))
    python3 - "$n" "$(basename "$bin")" "$rss" "$user" "$sys" "$wall" "$OUT_DIR/.ab.json" "$COUNT" "$db_us" <<'PY'
import json, sys
n, name, rss, user, sys_, wall, path, count, db_us = sys.argv[1:]
r = json.load(open(path))
done = r["applied"] + r["dead_lettered"]
if done != int(count):
    sys.exit(f"{name} applied or dead-lettered {done} of {count}")
cpu = (float(user) + float(sys_)) / done * 1e6
print(f"{n:<3} {name:<28} {done / r['active_secs']:>10,.0f} {done / (float(wall) - 5):>10,.0f} {int(rss) // 1024:>8} {cpu:>12.1f} {int(db_us) / done:>12.1f}")
PY
    SQL -e "DROP DATABASE $db"
  done
done
