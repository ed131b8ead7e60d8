#!/usr/bin/env bash
# A second opinion on `orderpipe cdc`'s values: Debezium's MariaDB connector reads the same binlog,
# and every column of every row state (insert, update before and after, delete) is compared with
# what MariaDB itself says about that row, for both.
#   1. a fresh database; the fixture's DDL (and its SET statements) run first;
#   2. `orderpipe cdc` twice (value_format json and avro) and Debezium (dev/debezium-lib.sh:
#      Connect standalone, JSON converter with schemas, Debezium's own defaults for every value
#      option) start at the binlog's end, over every table of the database, one partition each;
#   3. the fixture's DML (and its SET statements) run in one session, one statement at a time,
#      each followed by every table's rows as MariaDB renders them, in UTC (the oracle:
#      CAST(... AS CHAR), HEX for bytes, BIT as its number, FLOAT as the double it holds);
#   4. the change topics are read (read_committed, dev/debezium/TopicDump.java) until every row
#      state has arrived from each source, and dev/cdc-vs-debezium.py prints the table: type,
#      MariaDB's value, orderpipe's (json, avro), Debezium's, and whether each is MariaDB's value.
# The full table is kept as bench-results/cdc-vs-debezium.tsv. The database, topics and
# processes are removed on exit.
#
#   dev/cdc-vs-debezium.sh [FIXTURE]   (default tests/fixtures/cdc_types.sql: DDL and DML of the
#                                       current database, statements ending with `;` at line ends)
#   ORDERPIPE_BIN=...  the binary (default target/debug/orderpipe, built --features harness)
#   CDC_FORMATS="json avro"  the value formats of orderpipe to run
#   KEEP_WORK=1  keep the run's folder (logs, the records, MariaDB's rows) for a look
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export ORDERPIPE_BIN="${ORDERPIPE_BIN:-$HERE/../target/debug/orderpipe}"
source "$HERE/bench-common.sh"
source "$ROOT/dev/debezium-lib.sh"
FIXTURE="$(realpath "${1:-$ROOT/tests/fixtures/cdc_types.sql}")"
FORMATS="${CDC_FORMATS:-json avro}"
[ -f "$FIXTURE" ] || { echo "no fixture at $FIXTURE" >&2; exit 1; }
STARTED=$(date +%s)
dbz_run dbzcmp
REGISTRY="${ORDERPIPE_REGISTRY__URL:-http://127.0.0.1:8081/apis/ccompat/v7}"

# The fixture split into statements: SET statements go to both phases (session state: sql_mode,
# time_zone), DDL to the first, everything else to the second.
python3 - "$FIXTURE" "$WORK" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
stmts, cur = [], []
for line in text.splitlines():
    if not cur and (not line.strip() or line.lstrip().startswith("--")):
        continue
    cur.append(line)
    if line.rstrip().endswith(";"):
        stmts.append("\n".join(cur)); cur = []
if cur:
    stmts.append("\n".join(cur))
with open(f"{sys.argv[2]}/ddl.sql", "w") as ddl, open(f"{sys.argv[2]}/dml.txt", "w") as dml:
    for s in stmts:
        verb = re.sub(r"^(\s|--[^\n]*\n|/\*.*?\*/)*", "", s, flags=re.S).split(None, 1)[0].upper()
        if verb in ("SET", "USE", "CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"):
            ddl.write(s + "\n")
        if verb not in ("CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"):
            # one statement per record: its verb, then its text (NUL-separated)
            dml.write(f"{verb}\0{s}\0")
PY

echo "== database $DB: the fixture's DDL ($(basename "$FIXTURE"))"
SQL -e "CREATE DATABASE $DB"
SQL "$DB" < "$WORK/ddl.sql"
# A JSON column is a LONGTEXT with a json_valid() check: called json here.
SQL -e "SELECT c.TABLE_NAME, c.COLUMN_NAME, IF(k.CHECK_CLAUSE IS NULL, c.DATA_TYPE, 'json'),
    IF(k.CHECK_CLAUSE IS NULL, c.COLUMN_TYPE, 'json'), IFNULL(c.CHARACTER_SET_NAME, 'NULL'), c.COLUMN_KEY
  FROM information_schema.COLUMNS c JOIN information_schema.TABLES t USING (TABLE_SCHEMA, TABLE_NAME)
  LEFT JOIN information_schema.CHECK_CONSTRAINTS k ON k.CONSTRAINT_SCHEMA = c.TABLE_SCHEMA
    AND k.TABLE_NAME = c.TABLE_NAME AND k.CHECK_CLAUSE = CONCAT('json_valid(\`', c.COLUMN_NAME, '\`)')
  WHERE c.TABLE_SCHEMA = '$DB' AND t.TABLE_TYPE = 'BASE TABLE' ORDER BY c.TABLE_NAME, c.ORDINAL_POSITION" > "$WORK/columns.tsv"
mapfile -t TABLES < <(cut -f1 "$WORK/columns.tsv" | uniq)
(( ${#TABLES[@]} )) || { echo "the fixture created no table" >&2; exit 1; }
echo "   ${#TABLES[@]} tables: ${TABLES[*]}"

# The DML in one session, each statement followed by every table's rows as MariaDB renders them.
python3 - "$WORK" "$DB" <<'PY'
import sys
from collections import defaultdict
work, db = sys.argv[1], sys.argv[2]
cols = defaultdict(list)
for line in open(f"{work}/columns.tsv"):
    t, c, dtype, *_ = line.rstrip("\n").split("\t")
    q = f"`{c}`"
    if dtype == "bit":
        expr = f"CAST({q} + 0 AS CHAR)"
    elif dtype in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point",
                   "linestring", "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection"):
        expr = f"CONCAT('0x', HEX({q}))"
    elif dtype == "float":
        expr = f"CAST(CAST({q} AS DOUBLE) AS CHAR)"
    else:
        expr = f"CAST({q} AS CHAR)"
    cols[t].append(f"'{c}', {expr}")
def snapshot(n, verb):
    out = ["SET @cmp_tz = @@session.time_zone, time_zone = '+00:00';", f"SELECT 'snap', {n}, '{verb}';"]
    for t, exprs in cols.items():
        out.append(f"SELECT 'row', '{t}', JSON_OBJECT({', '.join(exprs)}) FROM `{db}`.`{t}`;")
    out.append("SET time_zone = @cmp_tz;")
    return "\n".join(out)
parts = open(f"{work}/dml.txt", encoding="utf-8").read().split("\0")
with open(f"{work}/dml.sql", "w", encoding="utf-8") as f:
    f.write(snapshot(0, "BASE") + "\n")
    n = 0
    for verb, stmt in zip(parts[0::2], parts[1::2]):
        f.write(stmt + "\n")
        if verb in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
            n += 1
            f.write(snapshot(n, verb) + "\n")
print(f"   {n} DML statements")
PY

: > "$WORK/topics.tsv"
: > "$WORK/stopped.txt"  # sources that exited: not waited for
# start_cdc FORMAT TABLE...: `orderpipe cdc` of the tables with value_format FORMAT, returning once
# it reads (CDC_PID_<FORMAT>). The same name again resumes at its checkpoint.
start_cdc() {
  local f=$1 prefix="$RUN_ID.cdc$1"; shift
  local args=(cdc --server-id "$((20000 + RANDOM))")
  for t in "$@"; do args+=(--table "$DB.$t"); done
  eval "CDC_TABLES_$f=(\"\$@\")"
  env ORDERPIPE_CDC__NAME="$RUN_ID$f" ORDERPIPE_CDC__TOPIC_PREFIX="$prefix" ORDERPIPE_CDC__OFFSETS_TOPIC="$prefix.offsets" \
    ORDERPIPE_CDC__PARTITIONS=1 ORDERPIPE_CDC__SOURCE="$DB_URL_BASE/$DB" ORDERPIPE_CDC__VALUE_FORMAT="$f" \
    ORDERPIPE_PRODUCER__TRANSACTIONAL_ID_PREFIX="$RUN_ID$f" \
    "$BIN" "${args[@]}" > "$WORK/cdc-$f.out" 2> "$WORK/cdc-$f.err" &
  PIDS+=($!); eval "CDC_PID_$f=$!"
  for _ in $(seq 600); do grep -q "reading" "$WORK/cdc-$f.err" && return; sleep 0.1; done
  cat "$WORK/cdc-$f.err" >&2; echo "cdc ($f) did not start" >&2; exit 1
}
# cdc_exited FORMAT: a cdc that stopped on a row of one table (`error: DB.TABLE: ...`) starts again
# from its checkpoint without that table (left out, and said so); any other exit stops the source
# (what it published is still compared).
cdc_exited() {
  local f=$1 err="$WORK/cdc-$1.err" bad
  bad=$(grep -o "^error: $DB\.[A-Za-z0-9_]*" "$err" | tail -1 | sed "s/^error: $DB\.//" || true)
  local -n tables="CDC_TABLES_$f"
  if [ -n "$bad" ] && printf '%s\n' "${tables[@]}" | grep -qx "$bad" && [ ${#tables[@]} -gt 1 ]; then
    local why; why=$(grep -m1 "^error: $DB\.$bad" "$err" | sed "s/^error: $DB\.$bad: //")
    echo "   orderpipe cdc ($f) stopped on $bad ($why): again without it"
    printf 'op-%s\t%s\t%s\n' "$f" "$bad" "$why" >> "$WORK/left-out.tsv"
    sed -i "/^op-$f\t$bad\t/d" "$WORK/topics.tsv"
    mv "$err" "$err.$bad"
    start_cdc "$f" $(printf '%s\n' "${tables[@]}" | grep -vx "$bad")
    return
  fi
  echo "   orderpipe cdc ($f) exited:"
  { grep -A1 "panicked at" "$err" || grep -v '^\s*$' "$err" | tail -2; } | sed 's/^/     /'
  echo "op-$f" >> "$WORK/stopped.txt"
}
: > "$WORK/left-out.tsv"
for f in $FORMATS; do
  echo "== orderpipe cdc, value_format $f ($BIN)"
  for t in "${TABLES[@]}"; do echo -e "op-$f\t$t\t$RUN_ID.cdc$f.$DB.$t" >> "$WORK/topics.tsv"; done
  start_cdc "$f" "${TABLES[@]}"
done

echo "== Debezium MariaDB connector $DBZ_VERSION (Connect standalone, JSON converter, schemas enabled)"
dbz_resolve || { echo "Debezium's jars could not be resolved" >&2; exit 1; }
# Every value option at Debezium's default, written out so the run records them.
DBZ_OPTIONS=(decimal.handling.mode=precise time.precision.mode=adaptive_time_microseconds
  binary.handling.mode=bytes bigint.unsigned.handling.mode=long enable.time.adjuster=true
  event.converting.failure.handling.mode=warn tombstones.on.delete=true
  topic.creation.default.partitions=1)
echo "   ${DBZ_OPTIONS[*]}"
# A table whose DDL Debezium's parser refuses stops the connector at start: it is left out (and
# said so), the others are captured.
DBZ_TABLES=("${TABLES[@]}")
while :; do
  dbz_config true "$DB" "$(printf "$DB.%s," "${DBZ_TABLES[@]}" | sed 's/,$//')"
  printf '%s\n' "${DBZ_OPTIONS[@]}" >> "$WORK/connector.properties"
  # a schema history and offsets of this attempt's own
  printf '%s\n' "schema.history.internal.kafka.topic=$RUN_ID.dbz.history${#DBZ_TABLES[@]}" >> "$WORK/connector.properties"
  rm -f "$WORK/dbz.offsets"
  dbz_start 2> "$WORK/dbz-start.err" && break
  kill "$PEER_PID" 2>/dev/null || true; wait "$PEER_PID" 2>/dev/null || true
  bad=$(grep -m1 -o "couldn't be parsed.* with the statement 'CREATE TABLE \`[^\`]*" "$WORK/connect.log" | sed 's/.*`//' || true)
  if [ -z "$bad" ] || [ ${#DBZ_TABLES[@]} = 1 ]; then cat "$WORK/dbz-start.err" >&2; exit 1; fi
  why=$(grep -m1 -o 'no viable alternative at input.*' "$WORK/connect.log" | tail -c 40 || true)
  echo "   Debezium cannot parse the DDL of $bad (no viable alternative at ...$why): left out"
  printf 'dbz\t%s\t%s\n' "$bad" "its DDL parser refuses the CREATE TABLE (no viable alternative at ...$why)" >> "$WORK/left-out.tsv"
  mapfile -t DBZ_TABLES < <(printf '%s\n' "${DBZ_TABLES[@]}" | grep -vx "$bad")
done
for t in "${DBZ_TABLES[@]}"; do echo -e "dbz\t$t\t$RUN_ID.dbz.$DB.$t" >> "$WORK/topics.tsv"; done

echo "== the fixture's DML, each statement followed by MariaDB's rows"
SQL --raw "$DB" < "$WORK/dml.sql" > "$WORK/timeline.txt"

# Every row state from each source, read_committed; a source that died or failed stops the wait.
javac -d "$WORK/classes" -cp "$KAFKA_LIB/*" "$ROOT/dev/debezium/TopicDump.java"
dump() {
  java -Dlog4j2.configurationFile="$ROOT/.stack/lib/tools-log4j2.properties" -cp "$WORK/classes:$KAFKA_LIB/*" \
    TopicDump "$BOOTSTRAP" $(cut -f3 "$WORK/topics.tsv") > "$WORK/dump.jsonl"
}
echo "== reading the change topics until every row state has arrived from each source"
for _ in $(seq 60); do
  dump
  rc=0; python3 "$ROOT/dev/cdc-vs-debezium.py" "$WORK" "$REGISTRY" check || rc=$?
  [ $rc = 0 ] && break
  [ $rc = 3 ] || exit $rc
  for f in $FORMATS; do
    pid_var="CDC_PID_$f"
    if ! kill -0 "${!pid_var}" 2>/dev/null && ! grep -qx "op-$f" "$WORK/stopped.txt"; then cdc_exited "$f"; fi
  done
  if grep -q "unrecoverable exception" "$WORK/connect.log"; then
    echo "   Debezium's task failed:"; grep -A3 "ERROR Error during binlog processing" "$WORK/connect.log" | sed 's/^/     /'
    break
  fi
  sleep 1
done
dump
STATUS=0
python3 "$ROOT/dev/cdc-vs-debezium.py" "$WORK" "$REGISTRY" || STATUS=$?
cp "$WORK/comparison.tsv" "$OUT_DIR/cdc-vs-debezium.tsv"
echo "== $(( $(date +%s) - STARTED )) s; the table: $OUT_DIR/cdc-vs-debezium.tsv"
exit $STATUS
