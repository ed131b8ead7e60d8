# Sourced by dev/bench-*.sh: paths, the release binary, a fresh run id and
# topic names of their own, so a benchmark never touches other data.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$ROOT/dev/stack.sh"
BIN="${ORDERPIPE_BIN:-$ROOT/target/release/orderpipe}"
# Not for orderpipe itself (it ignores a variable naming no setting, with a debug line; unset keeps that line out).
unset ORDERPIPE_BIN
RUN_ID="bench$(date +%s)"
OUT_DIR="$ROOT/bench-results"
# The stack measured: the default one, or another started with dev/stack.sh's
# own knobs (ORDERPIPE_STACK_DIR, ORDERPIPE_KAFKA_PORT, ORDERPIPE_REGISTRY_PORT,
# ORDERPIPE_MARIADB_PORT; orderpipe ignores them, not being settings): set
# the same ones here and every client below, orderpipe's included, goes to it.
[ -z "${ORDERPIPE_KAFKA_PORT:-}" ] \
  || export ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS="${ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:$ORDERPIPE_KAFKA_PORT}"
[ -z "${ORDERPIPE_REGISTRY_PORT:-}" ] \
  || export ORDERPIPE_REGISTRY__URL="${ORDERPIPE_REGISTRY__URL:-http://127.0.0.1:$ORDERPIPE_REGISTRY_PORT/apis/ccompat/v7}"
BOOTSTRAP="${ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
MARIADB_PORT="${ORDERPIPE_MARIADB_PORT:-3306}"
DB_URL_BASE="mysql://orderpipe:orderpipe@127.0.0.1:$MARIADB_PORT"
mkdir -p "$OUT_DIR"
[ -x "$BIN" ] || { echo "build first: cargo build --release --features harness" >&2; exit 1; }
# The bench-* commands and `produce --count` are the harness (make image
# builds the same path without it).
"$BIN" bench-naive-consume --help >/dev/null 2>&1 \
  || { echo "$BIN was built without the harness: cargo build --release --features harness" >&2; exit 1; }
export ORDERPIPE_TOPICS__ORDER_EVENTS__NAME="$RUN_ID.order.events.v1"
export ORDERPIPE_TOPICS__INVENTORY_EVENTS__NAME="$RUN_ID.inventory.events.v1"
export ORDERPIPE_TOPICS__DEAD_LETTER__NAME="$RUN_ID.order.events.v1.dlq"
TOPIC="$ORDERPIPE_TOPICS__ORDER_EVENTS__NAME"
SQL() { mariadb --protocol=tcp -h127.0.0.1 -P"$MARIADB_PORT" -uorderpipe -porderpipe -N -B "$@"; }
# A fresh database with the migrations applied.
mkdb() { SQL -e "CREATE DATABASE $1"; ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$1" "$BIN" migrate >/dev/null; }
# Machine-readable results, one line per measurement (columns and naming:
# src/harness/bench_report.rs), appended to target/bench/results.tsv;
# `make bench` starts the file afresh and `orderpipe bench-report` turns it
# into target/bench/report.md and SVG plots. A later line for the same
# benchmark, variant and metric replaces an earlier one in the report.
RESULTS="${BENCH_RESULTS:-$ROOT/target/bench/results.tsv}"
mkdir -p "$(dirname "$RESULTS")"
[ -s "$RESULTS" ] || printf 'benchmark\tvariant\tmetric\tvalue\tunit\tpeer\tcommand\n' > "$RESULTS"
# result BENCHMARK VARIANT METRIC VALUE UNIT PEER COMMAND
# Exactly 7 fields: an unquoted unit with a space once split a row in two and
# broke the report.
result() {
  (( $# == 7 )) || { echo "bench: result takes 7 fields, got $#: $*" >&2; return 1; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$RESULTS"
}
# db_at_version NAME VERSION: a new database NAME migrated up to VERSION (an
# earlier release's schema, for the upgrade benchmarks), exported as
# ORDERPIPE_DATABASE__URL.
db_at_version() {
  SQL -e "CREATE DATABASE $1"
  export ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$1"
  "$BIN" migrate --to "$2" >/dev/null
}
# in_chunks ROWS FN: FN FROM TO for consecutive ranges of 100,000 ids up to
# ROWS (a transaction each, for FN's INSERT ... FROM seq_FROM_to_TO), with
# progress on stderr.
in_chunks() {
  local rows=$1 fn=$2 from to
  for ((from = 1; from <= rows; from += 100000)); do
    to=$(( from + 99999 < rows ? from + 99999 : rows ))
    "$fn" "$from" "$to"
    printf '\r   %d / %d rows' "$to" "$rows" >&2
  done
  echo >&2
}
# jget FILE EXPR: EXPR evaluated in Python over the JSON object `r` read from FILE.
jget() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
# RSS in MB from a `/usr/bin/time -f %M` file (KB).
rss_mb() { echo $(( $(cat "$1") / 1024 )); }
# MariaDB's global statement counters into FILE (`SHOW GLOBAL STATUS`), read
# before and after a run: the difference over the events applied is the
# run's statements per event (`Questions` counts every statement a client
# sends, prepared executions included). Global: every client of the server
# counts, so run benchmarks on an otherwise quiet MariaDB.
db_counters() {
  SQL -e "SHOW GLOBAL STATUS WHERE Variable_name IN
    ('Questions','Com_insert','Com_insert_select','Com_update','Com_update_multi','Com_select','Com_delete','Com_delete_multi','Com_begin','Com_commit','Com_rollback')" > "$1"
}
# MariaDB's CPU time so far (user + system, microseconds) into FILE, read
# before and after a run like db_counters: the difference over the events
# applied is the server's CPU per event. From /proc/<pid>/stat (fields 14
# and 15, in clock ticks of `getconf CLK_TCK`), the pid from the server's
# own pid file (@@pid_file): a MariaDB on this machine only. Every client
# of the server counts, and background work (purge, page flushing) falls
# in whichever run it happens in. Read before db_counters and after it: its
# own query stays out of the statement counts.
db_cpu() {
  local pid
  pid="$(cat "$(SQL -e 'SELECT @@pid_file')")" && [ -r "/proc/$pid/stat" ] \
    || { echo "bench: no CPU time of the MariaDB on port $MARIADB_PORT (not on this machine?)" >&2; return 1; }
  proc_cpu "$pid" > "$1"
}
# broker_pid: the local Kafka broker's pid (the dev stack's pid file, else
# the first `kafka.Kafka` process); nothing and status 1 when there is none.
broker_pid() {
  local file="${ORDERPIPE_STACK_DIR:-$ROOT/.stack}/kafka.pid" pid=""
  [ -r "$file" ] && pid="$(cat "$file")" && [ -r "/proc/$pid/stat" ] || pid="$(pgrep -f 'kafka\.Kafka' | head -1)"
  [ -n "$pid" ] && echo "$pid"
}
# broker_cpu FILE: the local Kafka broker's CPU time so far (microseconds,
# as db_cpu), 0 when no broker process is found on this machine.
broker_cpu() {
  local pid
  pid="$(broker_pid)" || true
  if [ -n "$pid" ]; then proc_cpu "$pid"; else echo 0; fi > "$1"
}
# machine_cpu: the machine's busy CPU time so far, all cores (user, nice,
# system, irq, softirq, steal of /proc/stat; microseconds).
machine_cpu() {
  local f
  read -r -a f < /proc/stat
  echo $(( (f[1] + f[2] + f[3] + f[6] + f[7] + f[8]) * 1000000 / $(getconf CLK_TCK) ))
}
# proc_cpu PID: the process's CPU time so far (user + system, microseconds;
# its threads included, its children not), 0 when it is gone.
proc_cpu() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }
  # After the command name "(...) ": field 3 (state) first, so utime
  # (field 14) is f[11] and stime (15) f[12].
  read -r -a f <<<"${stat##*) }"
  echo $(( (f[11] + f[12]) * 1000000 / $(getconf CLK_TCK) ))
}
# cpu_per_event BEFORE AFTER EVENTS: MariaDB CPU microseconds per event
# between two db_cpu files.
cpu_per_event() {
  python3 -c 'import sys; print(f"{(int(open(sys.argv[2]).read()) - int(open(sys.argv[1]).read())) / max(int(sys.argv[3]), 1):.1f}")' "$@"
}
# counter BEFORE AFTER NAME: how much one db_counters counter grew.
counter() {
  echo $(( $(awk -v k="$3" '$1 == k {print $2}' "$2") - $(awk -v k="$3" '$1 == k {print $2}' "$1") ))
}
# per_event BEFORE AFTER EVENTS: Questions per event, then the breakdown
# (`insert=1.000 commit=0.010 ...`) on a second line.
per_event() {
  python3 - "$@" <<'PY'
import sys
read = lambda f: {k: int(v) for k, v in (l.split('\t') for l in open(f).read().split('\n') if l)}
before, after, events = read(sys.argv[1]), read(sys.argv[2]), max(int(sys.argv[3]), 1)
delta = {k: after[k] - before.get(k, 0) for k in after}
print(f"{delta.pop('Questions') / events:.4f}")
print(' '.join(f"{k.removeprefix('Com_')}={v / events:.3f}" for k, v in sorted(delta.items()) if v) or '-')
PY
}
# Every benchmark deletes its topics when it ends (a broker holding tens of
# thousands of partitions runs out of file descriptors).
drop_topics() { "$STACK" kafka-topics --delete --topic "$RUN_ID\\..*" >/dev/null 2>&1 || true; }
trap drop_topics EXIT
