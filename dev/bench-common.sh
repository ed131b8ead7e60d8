# Sourced by dev/bench-*.sh: paths, the release binary, a fresh run id and
# topic names of their own, so a benchmark never touches other data.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$ROOT/dev/stack.sh"
BIN="${ORDERPIPE_BIN:-$ROOT/target/release/orderpipe}"
# Not for orderpipe itself: it reads every ORDERPIPE_* variable as settings.
unset ORDERPIPE_BIN
RUN_ID="bench$(date +%s)"
OUT_DIR="$ROOT/bench-results"
BOOTSTRAP="${ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
DB_URL_BASE="mysql://orderpipe:orderpipe@127.0.0.1:3306"
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
SQL() { mariadb -h127.0.0.1 -uorderpipe -porderpipe -N -B "$@"; }
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
    ('Questions','Com_insert','Com_update','Com_select','Com_delete','Com_begin','Com_commit','Com_rollback')" > "$1"
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
