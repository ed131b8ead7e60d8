#!/usr/bin/env bash
# Incremental snapshots side by side, one run, same MariaDB (durability on: sync_binlog=1,
# innodb_flush_log_at_trx_commit=1) and the same broker:
#   orderpipe:  `orderpipe cdc` streaming, `orderpipe cdc snapshot start --table DB.snap`
#               (chunks of cdc.snapshot_chunk_rows, exactly once: Kafka transactions);
#   Debezium:   its MariaDB connector in Kafka Connect standalone (dev/debezium-lib.sh) streaming,
#               an `execute-snapshot` row in its signal table (incremental, chunks of the same size,
#               at least once).
# For each: ROWS read records to a read_committed consumer (rows/s over the last 90 % of them, and
# the wall time from the signal to the last one), and the stream's lag while the snapshot runs:
# LAG_ROWS single-row inserts 5 ms apart into another captured table, commit -> read_committed
# consumer p50/p99, next to the same measured with no snapshot running (the baseline).
#
#   dev/bench-cdc-snapshot.sh [ROWS] [LAG_ROWS]   (defaults 200000 and 1000; needs `make dev-up`)
#   CHUNK=4096 the chunk size of both; CDC_PEER=none skips Debezium.
set -euo pipefail
ROWS="${1:-200000}"
LAG_ROWS="${2:-1000}"
CHUNK="${CHUNK:-4096}"
PEER="${CDC_PEER:-debezium}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
source "$ROOT/dev/debezium-lib.sh"
source "$ROOT/dev/bench-cdc-lib.sh"
dbz_run snap

echo "== database $DB: snap ($ROWS rows), lat0..lat2 (lag probes), Debezium's signal table"
mkdb "$DB"
SQL "$DB" -e "CREATE TABLE $DB.snap (id BIGINT PRIMARY KEY, order_id BIGINT NOT NULL, status INT NOT NULL,
    amount DECIMAL(12,2) NOT NULL, note VARCHAR(64) NOT NULL, updated_at DATETIME(6) NOT NULL);
  INSERT INTO $DB.snap SELECT seq, seq DIV 4, 1, (seq MOD 1000) + 0.25, CONCAT('order ', seq, ' note'),
    UTC_TIMESTAMP(6) FROM seq_1_to_$ROWS;
  CREATE TABLE $DB.lat0 (id BIGINT PRIMARY KEY, written_at DATETIME(6) NOT NULL);
  CREATE TABLE $DB.lat1 LIKE $DB.lat0; CREATE TABLE $DB.lat2 LIKE $DB.lat0;
  CREATE TABLE $DB.dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, data VARCHAR(2048) NULL);
  ANALYZE TABLE $DB.snap" >/dev/null
TABLES="$DB.snap,$DB.lat0,$DB.lat1,$DB.lat2"
CDC_TOPIC="$RUN_ID.cdc.$DB"
DBZ_TOPIC="$RUN_ID.dbz.$DB"
export ORDERPIPE_CDC__NAME="$RUN_ID" ORDERPIPE_CDC__TOPIC_PREFIX="$RUN_ID.cdc" ORDERPIPE_CDC__OFFSETS_TOPIC="$RUN_ID.cdc.offsets"
export ORDERPIPE_CDC__PARTITIONS=3 ORDERPIPE_CDC__SOURCE="$DB_URL_BASE/$DB" ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$DB"
export ORDERPIPE_CDC__SNAPSHOT_CHUNK_ROWS="$CHUNK" ORDERPIPE_PRODUCER__TRANSACTIONAL_ID_PREFIX="$RUN_ID"
CDC_NAME="orderpipe cdc incremental snapshot (exactly once)"
DBZ_NAME="Debezium MariaDB 3.5.0 incremental snapshot (Connect standalone, at least once)"

"$BIN" cdc --output json --table "$TABLES" --server-id "$((20000 + RANDOM))" > "$WORK/cdc.out" 2> "$WORK/cdc.err" &
CDC_PID=$!; PIDS+=("$CDC_PID")
for _ in $(seq 300); do grep -q "reading" "$WORK/cdc.err" && break; sleep 0.1; done
grep -q "reading" "$WORK/cdc.err" || { cat "$WORK/cdc.err" >&2; echo "cdc did not start" >&2; exit 1; }
HAVE_PEER=0
if [ "$PEER" = debezium ] && dbz_resolve; then
  dbz_config false "$DB" "$TABLES,$DB.dbz_signal"
  printf '%s\n' producer.linger.ms=5 producer.batch.size=262144 >> "$WORK/worker.properties"
  printf '%s\n' max.batch.size=8192 max.queue.size=32768 poll.interval.ms=10 \
    "signal.data.collection=$DB.dbz_signal" "incremental.snapshot.chunk.size=$CHUNK" >> "$WORK/connector.properties"
  for t in snap lat0 lat1 lat2; do
    "$STACK" kafka-topics --create --topic "$DBZ_TOPIC.$t" --partitions 3 --replication-factor 1 >/dev/null
  done
  dbz_start || exit 1
  HAVE_PEER=1
else
  echo "== peer skipped (CDC_PEER=$PEER or its jars could not be resolved)"
fi

# probe TABLE FIRST: LAG_ROWS inserts 5 ms apart into TABLE (ids FIRST..), in the background (PROBE_PID).
probe() {
  for i in $(seq "$2" $(( $2 + LAG_ROWS - 1 ))); do
    echo "INSERT INTO $DB.$1 VALUES ($i, UTC_TIMESTAMP(6)); DO SLEEP(0.005);"
  done | SQL "$DB" &
  PROBE_PID=$!
}
# lag_of WHO TABLE VARIANT PEER: the probe's lag on WHO's topic of TABLE, reported.
lag_of() {
  SQL -e "SELECT id, CAST(UNIX_TIMESTAMP(CONVERT_TZ(written_at, '+00:00', @@session.time_zone)) * 1000000 AS INTEGER) FROM $DB.$2" > "$WORK/written-$2.tsv"
  local p50 p99 max rest
  read -r p50 p99 max rest <<<"$(WRITTEN="$WORK/written-$2.tsv" lag "$WORK/$1-$2.tsv" /dev/null "$3")"
  echo "   $3: stream lag p50 $p50 ms, p99 $p99 ms, max $max ms"
  result cdc-snapshot "$3" "stream lag p50" "$p50" ms "$4" "dev/bench-cdc-snapshot.sh $ROWS $LAG_ROWS"
  result cdc-snapshot "$3" "stream lag p99" "$p99" ms "$4" "dev/bench-cdc-snapshot.sh $ROWS $LAG_ROWS"
}

echo "== baseline: $LAG_ROWS inserts 5 ms apart, no snapshot running"
stamp "$CDC_TOPIC.lat0" "$LAG_ROWS" "$WORK/cdc-lat0.tsv"
[ $HAVE_PEER = 1 ] && stamp "$DBZ_TOPIC.lat0" "$LAG_ROWS" "$WORK/debezium-lat0.tsv"
probe lat0 0; wait "$PROBE_PID"
wait_stamps "$WORK/cdc-lat0.tsv" "$LAG_ROWS" 120
[ $HAVE_PEER = 1 ] && wait_stamps "$WORK/debezium-lat0.tsv" "$LAG_ROWS" 120
lag_of cdc lat0 "orderpipe cdc, no snapshot" ""
[ $HAVE_PEER = 1 ] && lag_of debezium lat0 "Debezium, no snapshot" ""

# snapshot WHO TOPIC LAT SIGNAL...: stamps of TOPIC's ROWS read records and of LAT's probe, the
# signal (a command), then the probe; sets SNAP_RATE (rows/s, last 90 %) and SNAP_WALL (s).
snapshot() {
  local who=$1 topic=$2 lat=$3; shift 3
  stamp "$topic" "$ROWS" "$WORK/$who-snap.tsv"; local consumer=$CONSUMER_PID
  stamp "${topic%.snap}.$lat" "$LAG_ROWS" "$WORK/$who-$lat.tsv"
  local t0; t0=$(date +%s%N)
  "$@"
  probe "$lat" 0
  wait_stamps "$WORK/$who-snap.tsv" "$ROWS" 1200
  wait "$consumer" 2>/dev/null || true
  wait "$PROBE_PID"
  wait_stamps "$WORK/$who-$lat.tsv" "$LAG_ROWS" 120
  SNAP_RATE=$(rate "$WORK/$who-snap.tsv")
  SNAP_WALL=$(python3 -c "
import sys
last = max(int(l.split()[0]) for l in open('$WORK/$who-snap.tsv'))
print(f'{(last - $t0 / 1000) / 1e6:.1f}')")
  echo "   $who: $ROWS rows, $SNAP_RATE rows/s (last 90 %), ${SNAP_WALL} s from the signal to the last row"
}
cdc_start() { "$BIN" cdc snapshot start --table "$DB.snap" --by bench >/dev/null; }
dbz_signal() {
  SQL -e "INSERT INTO $DB.dbz_signal VALUES ('bench-$RUN_ID', 'execute-snapshot',
    '{\"data-collections\": [\"$DB.snap\"], \"type\": \"incremental\"}')"
}
PEER_ROW=$([ $HAVE_PEER = 1 ] && echo "$DBZ_NAME, $ROWS rows")

echo "== orderpipe: cdc snapshot start --table $DB.snap (chunks of $CHUNK), $LAG_ROWS probe inserts meanwhile"
snapshot cdc "$CDC_TOPIC.snap" lat1 cdc_start
result cdc-snapshot "$CDC_NAME, $ROWS rows" "snapshot throughput" "$SNAP_RATE" rows/s "$PEER_ROW" "orderpipe cdc snapshot start (dev/bench-cdc-snapshot.sh)"
result cdc-snapshot "$CDC_NAME, $ROWS rows" "signal to last row" "$SNAP_WALL" s "$PEER_ROW" "orderpipe cdc snapshot start (dev/bench-cdc-snapshot.sh)"
CDC_SNAP_RATE=$SNAP_RATE CDC_SNAP_WALL=$SNAP_WALL
lag_of cdc lat1 "orderpipe cdc, during its snapshot" "orderpipe cdc, no snapshot"
if [ $HAVE_PEER = 1 ]; then
  echo "== Debezium: execute-snapshot (incremental, chunks of $CHUNK), $LAG_ROWS probe inserts meanwhile"
  snapshot debezium "$DBZ_TOPIC.snap" lat2 dbz_signal
  result cdc-snapshot "$DBZ_NAME, $ROWS rows" "snapshot throughput" "$SNAP_RATE" rows/s "" "execute-snapshot signal row (dev/bench-cdc-snapshot.sh)"
  result cdc-snapshot "$DBZ_NAME, $ROWS rows" "signal to last row" "$SNAP_WALL" s "" "execute-snapshot signal row (dev/bench-cdc-snapshot.sh)"
  lag_of debezium lat2 "Debezium, during its snapshot" "Debezium, no snapshot"
  echo
  python3 -c "print(f'orderpipe / Debezium: throughput {$CDC_SNAP_RATE / $SNAP_RATE:.2f}x, wall time {$CDC_SNAP_WALL / $SNAP_WALL:.2f}x')"
fi
kill -TERM "$CDC_PID"; wait "$CDC_PID" 2>/dev/null || true
