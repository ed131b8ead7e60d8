#!/usr/bin/env bash
# Peak memory of `orderpipe cdc` for ONE large binlog transaction (issue 24):
# ROWS rows inserted by a single `INSERT INTO big SELECT ... FROM seq_1_to_ROWS`
# (five columns, about 60 bytes of row each in the binlog), read by a running
# cdc; its VmHWM (peak resident set, /proc/<pid>/status) is read every 200 ms
# until every change is published (orderpipe_cdc_changes_total on its
# /metrics) or the process exits, and once idle before the transaction.
#
#   dev/bench-cdc-bigtx.sh [ROWS]   (default 1000000; needs `make dev-up` and a
#   release build: cargo build --release --features harness --bin orderpipe)
#
# ORDERPIPE_BIN picks the binary (e.g. a build of an older commit), and
# BATCH_MAX_ROWS sets cdc.batch_max_rows (default: the configuration's 20000).
# Not part of `make test` or `make bench`: a measurement, about a minute.
set -euo pipefail
ROWS="${1:-1000000}"
BATCH="${BATCH_MAX_ROWS:-}"
unset BATCH_MAX_ROWS
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
RUN_ID="bigtx$(date +%s)p$$"
DB="$RUN_ID"
WORK="$OUT_DIR/.bigtx-$RUN_ID"
mkdir -p "$WORK"
CDC_PID=""
cleanup() {
  [ -n "$CDC_PID" ] && kill "$CDC_PID" 2>/dev/null || true
  SQL -e "DROP DATABASE IF EXISTS $DB" 2>/dev/null || true
  drop_topics
  rm -rf "$WORK"
}
trap cleanup EXIT

SQL -e "CREATE DATABASE $DB;
  CREATE TABLE $DB.big (id BIGINT PRIMARY KEY, order_id BIGINT NOT NULL, status INT NOT NULL,
    amount DECIMAL(12,2) NOT NULL, note VARCHAR(64) NOT NULL)"
export ORDERPIPE_CDC__NAME="$RUN_ID" ORDERPIPE_CDC__TOPIC_PREFIX="$RUN_ID.cdc" ORDERPIPE_CDC__OFFSETS_TOPIC="$RUN_ID.cdc.offsets"
export ORDERPIPE_CDC__PARTITIONS=3 ORDERPIPE_CDC__SOURCE="$DB_URL_BASE/$DB"
export ORDERPIPE_PRODUCER__TRANSACTIONAL_ID_PREFIX="$RUN_ID"
[ -n "$BATCH" ] && export ORDERPIPE_CDC__BATCH_MAX_ROWS="$BATCH"
PORT=$((20000 + RANDOM % 20000))
"$BIN" cdc --table "$DB.big" --server-id "$((40000 + RANDOM))" --health-addr "127.0.0.1:$PORT" \
  > "$WORK/cdc.out" 2> "$WORK/cdc.err" &
CDC_PID=$!
for _ in $(seq 300); do grep -q "reading" "$WORK/cdc.err" && break; sleep 0.1; done
grep -q "reading" "$WORK/cdc.err" || { cat "$WORK/cdc.err" >&2; echo "cdc did not start" >&2; exit 1; }
hwm() { awk '/^VmHWM/ {print $2}' "/proc/$CDC_PID/status" 2>/dev/null || true; }
published() {
  { curl -s --noproxy '*' "http://127.0.0.1:$PORT/metrics" || true; } \
    | awk '/^orderpipe_cdc_changes_total/ {n += $NF} END {print n + 0}'
}
IDLE_KB=$(hwm)

echo "== one transaction of $ROWS rows"
T0=$(date +%s.%N)
SQL "$DB" -e "INSERT INTO big SELECT seq, seq * 7, seq % 5, seq / 100, CONCAT('order note ', seq) FROM seq_1_to_$ROWS"
T1=$(date +%s.%N)
PEAK_KB=$IDLE_KB
DONE=0
DEADLINE=$(( $(date +%s) + 900 ))
while kill -0 "$CDC_PID" 2>/dev/null && [ "$(date +%s)" -lt "$DEADLINE" ]; do
  K=$(hwm); [ -n "$K" ] && PEAK_KB=$K
  DONE=$(published)
  [ "$DONE" -ge "$ROWS" ] && break
  sleep 0.2
done
T2=$(date +%s.%N)
K=$(hwm); [ -n "$K" ] && PEAK_KB=$K
STATUS="published $DONE of $ROWS changes"
if ! kill -0 "$CDC_PID" 2>/dev/null; then
  wait "$CDC_PID" && RC=0 || RC=$?
  STATUS="$STATUS; cdc exited ($RC): $(grep -v '^\s*$' "$WORK/cdc.err" | tail -1)"
else
  kill -TERM "$CDC_PID"; wait "$CDC_PID" 2>/dev/null || true
fi
CDC_PID=""
KTX=$(grep -o 'in [0-9]* Kafka transactions' "$WORK/cdc.out" | grep -o '[0-9]*' || echo "?")
printf 'binary %s\nbatch_max_rows %s\ninsert %.1f s; cdc %.1f s after the commit\n%s; %s Kafka transactions\nVmHWM idle %d MB, peak %d MB\n' \
  "$BIN" "${BATCH:-default}" "$(echo "$T1 - $T0" | bc)" "$(echo "$T2 - $T1" | bc)" "$STATUS" "$KTX" \
  $((IDLE_KB / 1024)) $((PEAK_KB / 1024))
result cdc-bigtx "orderpipe cdc, batch_max_rows ${BATCH:-20000}" "peak RSS, one $ROWS-row transaction" \
  $((PEAK_KB / 1024)) MB - "dev/bench-cdc-bigtx.sh $ROWS"
