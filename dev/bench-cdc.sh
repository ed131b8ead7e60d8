#!/usr/bin/env bash
# The binlog source's numbers, one run, same MariaDB (binlog on, sync_binlog=1,
# innodb_flush_log_at_trx_commit=1: durability on) and the same broker:
#   1. the database's own write rate: ROWS single-row autocommit INSERTs from
#      CLIENTS parallel clients (the plain insert load cdc has to keep up with);
#   2. catch-up throughput: `orderpipe cdc` (exactly once: Kafka transactions)
#      and the peer, Debezium's MariaDB connector in Kafka Connect standalone
#      (at least once; JSON; tuned: max.batch.size 8192, max.queue.size 32768,
#      poll.interval.ms 10, producer linger 5 ms), each stopped before the load and restarted after
#      it, read the same ROWS-change backlog; rows/s over the last 90 % of the
#      changes arriving at a read_committed consumer;
#   3. lag: LAG_ROWS single-row inserts 5 ms apart with both running; from the
#      row's UTC_TIMESTAMP(6) (taken just before its commit) to its arrival at
#      a read_committed consumer (kafka-console-consumer, fetch.max.wait.ms=10),
#      p50/p99 each, split at the record's CreateTime (set by the producer when
#      the record is handed to it): commit -> produced (binlog read, batching,
#      encoding) and produced -> consumed (send, Kafka commit, fetch); cdc's
#      own stage times (gather, encode, produce, commit) from its summary.
# The peer runs through dev/debezium-lib.sh (its jars from Maven Central, a
# shim for Kafka 4.4). Skip the peer with CDC_PEER=none; CDC_EXTRA_ARGS (split on spaces) go to
# `orderpipe cdc`, e.g. CDC_EXTRA_ARGS="-X linger.ms=5" for an A/B. CDC_REDACT="hash=note,amount"
# (or drop=/mask=) gives the load table those [cdc.redact] rules, for the cost of masking.
#
#   dev/bench-cdc.sh [ROWS] [LAG_ROWS]   (defaults 100000 and 2000; needs `make dev-up`)
set -euo pipefail
ROWS="${1:-100000}"
LAG_ROWS="${2:-2000}"
CLIENTS="${CLIENTS:-4}"
PEER="${CDC_PEER:-debezium}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
source "$ROOT/dev/debezium-lib.sh"
source "$ROOT/dev/bench-cdc-lib.sh"
dbz_run cdc

# Test databases left by earlier test runs (op_t<hex>, as dev/test.sh drops them) fill the buffer pool;
# only those with no table created in the last 30 minutes: a test running now keeps its database.
for leftover in $(SQL -e "SELECT table_schema FROM information_schema.tables WHERE table_schema REGEXP '^op_t[0-9a-f]{10}\$'
    GROUP BY table_schema HAVING MAX(create_time) < NOW() - INTERVAL 30 MINUTE"); do
  SQL -e "DROP DATABASE \`$leftover\`"
done

SQL -e "CREATE DATABASE $DB;
  CREATE TABLE $DB.load (id BIGINT PRIMARY KEY, order_id BIGINT NOT NULL, status INT NOT NULL,
    amount DECIMAL(12,2) NOT NULL, note VARCHAR(64) NOT NULL, updated_at DATETIME(6) NOT NULL);
  CREATE TABLE $DB.lat (id BIGINT PRIMARY KEY, written_at DATETIME(6) NOT NULL)"
CDC_TOPIC="$RUN_ID.cdc.$DB"
DBZ_TOPIC="$RUN_ID.dbz.$DB"
export ORDERPIPE_CDC__NAME="$RUN_ID" ORDERPIPE_CDC__TOPIC_PREFIX="$RUN_ID.cdc" ORDERPIPE_CDC__OFFSETS_TOPIC="$RUN_ID.cdc.offsets"
export ORDERPIPE_CDC__PARTITIONS=3 ORDERPIPE_CDC__SOURCE="$DB_URL_BASE/$DB"
export ORDERPIPE_PRODUCER__TRANSACTIONAL_ID_PREFIX="$RUN_ID"
if [[ -n "${CDC_REDACT:-}" ]]; then
  action="${CDC_REDACT%%=*}" columns="${CDC_REDACT#*=}"
  printf '[cdc.redact."%s.load"]\n%s = ["%s"]\n' "$DB" "$action" "${columns//,/\", \"}" > "$RESULTS.redact.toml"
  export ORDERPIPE_CONFIG="$RESULTS.redact.toml" ORDERPIPE_CDC__HASH_KEY="bench-key-of-at-least-32-bytes-long"
  echo "cdc with [cdc.redact.\"$DB.load\"] $action = [$columns]"
fi
CDC_ARGS=(cdc --output json --table "$DB.load,$DB.lat" --server-id "$((20000 + RANDOM))" ${CDC_EXTRA_ARGS:-})
# Variant names of the report's rows; a row's peer is the other's variant of the same metric.
CDC_NAME="orderpipe cdc (exactly once)"
DBZ_NAME="Debezium MariaDB 3.5.0 (Connect standalone, at least once)"

# start_cdc: runs cdc in the background until it reads the binlog.
start_cdc() {
  "$BIN" "${CDC_ARGS[@]}" > "$WORK/cdc.out" 2> "$WORK/cdc.err" &
  CDC_PID=$!; PIDS+=("$CDC_PID")
  for _ in $(seq 300); do grep -q "reading" "$WORK/cdc.err" && return; sleep 0.1; done
  cat "$WORK/cdc.err" >&2; echo "cdc did not start" >&2; exit 1
}
stop() { kill -TERM "$1"; wait "$1" 2>/dev/null || true; }

# The peer: Debezium's MariaDB connector in Connect standalone (dev/debezium-lib.sh), JSON without
# schemas, tuned for throughput.
peer_ready() {
  [ "$PEER" = debezium ] || return 1
  dbz_resolve || return 1
  dbz_config false "$DB" "$DB.load,$DB.lat"
  printf '%s\n' producer.linger.ms=5 producer.batch.size=262144 >> "$WORK/worker.properties"
  printf '%s\n' max.batch.size=8192 max.queue.size=32768 poll.interval.ms=10 >> "$WORK/connector.properties"
  for t in load lat; do
    "$STACK" kafka-topics --create --topic "$DBZ_TOPIC.$t" --partitions 3 --replication-factor 1 >/dev/null
  done
}
start_peer() { dbz_start || exit 1; }


echo "== cdc ${CDC_ARGS[*]}: starts at the binlog's end (checkpoint), then stops"
start_cdc; stop "$CDC_PID"
HAVE_PEER=0
if peer_ready; then
  echo "== Debezium MariaDB connector: starts streaming, records its offset, then stops"
  start_peer; sleep 3; stop "$PEER_PID"; HAVE_PEER=1
else
  echo "== peer skipped (CDC_PEER=$PEER or its jars could not be resolved)"
fi

echo "== insert load: $ROWS single-row autocommit INSERTs from $CLIENTS clients (the database's own write rate)"
python3 - "$WORK" "$ROWS" "$CLIENTS" "$DB" <<'PY'
import sys
work, rows, clients, db = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
files = [open(f"{work}/load-{c}.sql", "w") for c in range(clients)]
for i in range(rows):
    files[i % clients].write(f"INSERT INTO {db}.load VALUES ({i}, {i // 4}, 1, {i % 1000}.25, 'order {i} note', UTC_TIMESTAMP(6));\n")
PY
t0=$(date +%s%N)
LOADERS=()
for c in $(seq 0 $((CLIENTS - 1))); do SQL "$DB" < "$WORK/load-$c.sql" & LOADERS+=($!); done
for p in "${LOADERS[@]}"; do wait "$p"; done
LOAD_SECS=$(python3 -c "print(($(date +%s%N) - $t0) / 1e9)")
[ "$(SQL -e "SELECT COUNT(*) FROM $DB.load")" -eq "$ROWS" ] || { echo "the load did not insert $ROWS rows" >&2; exit 1; }
LOAD_RATE=$(python3 -c "print(f'{$ROWS / $LOAD_SECS:.0f}')")
echo "   $ROWS rows in ${LOAD_SECS%.*} s: $LOAD_RATE rows/s (= commits/s)"
result cdc "MariaDB insert load, $CLIENTS clients, sync_binlog=1" "write rate" "$LOAD_RATE" rows/s "" \
  "$CLIENTS x mariadb < single-row INSERTs (autocommit)"

# stage_table SUMMARY PHASE: cdc's stage times (its --output json summary) as a table.
stage_table() {
  echo "== cdc's stage times in $2 (ms per batch; from its --output json summary)"
  python3 - "$1" <<'PY'
import json, sys
stages = json.load(open(sys.argv[1]))["stages_ms"]
print(f"   {'stage':<8} {'batches':>8} {'mean':>8} {'p50':>8} {'p99':>8} {'max':>8} {'total s':>8}")
for name in ("gather", "encode", "produce", "commit"):
    t = stages.get(name)
    if t:
        print(f"   {name:<8} {t['count']:>8} {t['mean']:>8.2f} {t['p50']:>8.2f} {t['p99']:>8.2f} {t['max']:>8.2f} {t['count'] * t['mean'] / 1000:>8.2f}")
PY
}
# catch_up WHO TOPIC START PID_VAR: a stamping consumer of TOPIC, then START (start_cdc or
# start_peer, which sets PID_VAR) reads the backlog; sets CAUGHT_UP to the rows/s, and prints
# the CPU each process spent per row (on 2 cores the machine's whole budget is 2 s per s).
catch_up() {
  stamp "$2" "$ROWS" "$WORK/$1-load.tsv"
  local consumer=$CONSUMER_PID kafka db0 kafka0 all0
  kafka="$(broker_pid)"
  db0=$(db_cpu /dev/stdout); kafka0=$(proc_cpu "$kafka"); all0=$(machine_cpu)
  "$3"
  wait_stamps "$WORK/$1-load.tsv" "$ROWS" 600
  local who=$(proc_cpu "${!4}") db=$(( $(db_cpu /dev/stdout) - db0 )) k=$(( $(proc_cpu "$kafka") - kafka0 ))
  local all=$(( $(machine_cpu) - all0 ))
  wait "$consumer" 2>/dev/null || true
  CAUGHT_UP=$(rate "$WORK/$1-load.tsv")
  echo "   $1: $CAUGHT_UP rows/s to a read_committed consumer"
  python3 -c 'import sys; rows = int(sys.argv[1]); print("      CPU per row: " + ", ".join(f"{n} {int(v) / rows:.1f} µs" for n, v in zip(sys.argv[2::2], sys.argv[3::2])))' \
    "$ROWS" "$1 (its start included)" "$who" Kafka "$k" MariaDB "$db" "the rest (the stamping consumer, ...)" "$(( all - who - k - db ))"
}
echo "== cdc catches up the $ROWS-change backlog"
catch_up cdc "$CDC_TOPIC.load" start_cdc CDC_PID; CDC_RATE=$CAUGHT_UP
CMD="orderpipe ${CDC_ARGS[*]}"
result cdc "$CDC_NAME, $ROWS-change backlog" "catch-up throughput" "$CDC_RATE" rows/s \
  "$([ $HAVE_PEER = 1 ] && echo "$DBZ_NAME, $ROWS-change backlog")" "$CMD"
stop "$CDC_PID"
cp "$WORK/cdc.out" "$WORK/cdc-catchup.out"
stage_table "$WORK/cdc-catchup.out" "the catch-up"
if [ $HAVE_PEER = 1 ]; then
  echo "== Debezium catches up the same backlog"
  catch_up debezium "$DBZ_TOPIC.load" start_peer PEER_PID; DBZ_RATE=$CAUGHT_UP
  result cdc "$DBZ_NAME, $ROWS-change backlog" "catch-up throughput" \
    "$DBZ_RATE" rows/s "" "ConnectStandalone + io.debezium.connector.mariadb.MariaDbConnector (dev/bench-cdc.sh)"
fi
# A fresh cdc for the lag phase: its summary's stage times are the lag phase's alone.
start_cdc

echo "== lag: $LAG_ROWS single-row inserts 5 ms apart, commit -> read_committed consumer"
stamp "$CDC_TOPIC.lat" "$((LAG_ROWS + 1))" "$WORK/cdc-lat.tsv"
[ $HAVE_PEER = 1 ] && stamp "$DBZ_TOPIC.lat" "$((LAG_ROWS + 1))" "$WORK/dbz-lat.tsv"
# One untimed row first: a topic's first record costs cdc a schema lookup (~180 ms, once per
# topic and process), which would otherwise delay the first timed rows queued behind it.
SQL "$DB" -e "INSERT INTO $DB.lat VALUES (-1, UTC_TIMESTAMP(6))"
wait_stamps "$WORK/cdc-lat.tsv" 1 60
[ $HAVE_PEER = 1 ] && wait_stamps "$WORK/dbz-lat.tsv" 1 60
for i in $(seq 0 $((LAG_ROWS - 1))); do
  echo "INSERT INTO $DB.lat VALUES ($i, UTC_TIMESTAMP(6)); DO SLEEP(0.005);"
done | SQL "$DB"
SQL -e "SELECT id, CAST(UNIX_TIMESTAMP(CONVERT_TZ(written_at, '+00:00', @@session.time_zone)) * 1000000 AS INTEGER) FROM $DB.lat" > "$WORK/written.tsv"
wait_stamps "$WORK/cdc-lat.tsv" "$((LAG_ROWS + 1))" 120
[ $HAVE_PEER = 1 ] && wait_stamps "$WORK/dbz-lat.tsv" "$((LAG_ROWS + 1))" 120
# report_lag VARIANT PEER CMD STAMPS SLUG
report_lag() {
  local p50 p99 max k50 k99 c50 c99 odd
  read -r p50 p99 max k50 k99 c50 c99 odd <<<"$(lag "$4" "$(dirname "$RESULTS")/cdc-latency-$5.txt" "$1")"
  echo "   $1: p50 $p50 ms, p99 $p99 ms, max $max ms"
  echo "      commit -> produced (CreateTime): p50 $k50 ms, p99 $k99 ms; produced -> consumed: p50 $c50 ms, p99 $c99 ms"
  [ "$odd" = 0 ] || echo "      note: $odd records have a CreateTime over 1 ms before their commit stamp"
  result cdc "$1" "lag p50" "$p50" ms "$2" "$3"
  result cdc "$1" "lag p99" "$p99" ms "$2" "$3"
  result cdc "$1" "lag p50, commit -> produced" "$k50" ms "$2" "$3"
  result cdc "$1" "lag p99, commit -> produced" "$k99" ms "$2" "$3"
  result cdc "$1" "lag p50, produced -> consumed" "$c50" ms "$2" "$3"
  result cdc "$1" "lag p99, produced -> consumed" "$c99" ms "$2" "$3"
}
rm -f "$(dirname "$RESULTS")"/cdc-latency-*.txt  # this run's alone on the report's CDF
report_lag "$CDC_NAME" "$([ $HAVE_PEER = 1 ] && echo "$DBZ_NAME")" "$CMD" "$WORK/cdc-lat.tsv" cdc
[ $HAVE_PEER = 1 ] && report_lag "$DBZ_NAME" "" "ConnectStandalone + MariaDbConnector" "$WORK/dbz-lat.tsv" debezium
stop "$CDC_PID"; [ $HAVE_PEER = 1 ] && stop "$PEER_PID"
stage_table "$WORK/cdc.out" "the lag phase"
echo
echo "cdc vs the database's own write rate ($CLIENTS clients, durability on): $LOAD_RATE rows/s written, $CDC_RATE rows/s captured$([ $HAVE_PEER = 1 ] && echo ", Debezium $DBZ_RATE rows/s")"
