#!/usr/bin/env bash
# `make bench`: every benchmark with its peers, in one run, then the report.
#
#   dev/bench-all.sh          (needs `make dev-up` and the release binary built
#                              with the harness: `make bench` does both)
#
# Runs dev/bench-produce.sh, bench-consume.sh, bench-dlq.sh, bench-relay.sh,
# bench-ordering.sh, bench-delivery.sh, bench-crash.sh, bench-cdc.sh, bench-cdc-snapshot.sh, bench-console.sh and
# bench-dedup-upgrade.sh one after the other (each runs its peers side by side:
# Kafka's perf tools, the naive per-record consumer, before/after), collects
# their rows in a fresh target/bench/results.tsv, and writes
# target/bench/report.md and the SVG plots with `orderpipe bench-report`.
# Everything it prints also lands in target/bench/bench.log.
#
# Sizes (environment or make variables):
#   SCALE=0.1          multiplies every default size below (default 1)
#   COUNT=N            events of produce, consume, dlq and ordering at once
#   PRODUCE_COUNT=N    default 1,000,000     CONSUME_COUNT=N  default 1,000,000
#   NAIVE=N            default 50,000 (records the naive consumer processes)
#   DLQ_COUNT=N        default 100,000       ORDERING_COUNT=N default 100,000
#   DELIVERY_COUNT=N   default 12,000 (events deliver POSTs to an endpoint answering after 50 ms;
#                      in_flight 1 runs at ~240/s on 12 partitions; not COUNT)
#   ROWS=N             default 1,000,000 (relay outbox rows; the 50 and 200 rows per
#                      transaction runs publish the first 100,000 of them)
#   RATE=N             default 100 (orders/s of the relay's latency run; not scaled)
#   CRASH_COUNT=N      default 1,000,000 (two members SIGKILLed 20 times; not COUNT)
#   CDC_ROWS=N         default 100,000 (binlog backlog cdc and Debezium catch up; 2,000 rows for lag)
#   SNAPSHOT_ROWS=N    default 200,000 (the table cdc's and Debezium's incremental snapshots read; 1,000 lag probes)
#   CONSOLE_DEAD=N     default 100,000 (dead letters behind the console pages; replays of 20,000 x 5 pairs)
#   UPGRADE_ROWS=N     default 10,000,000 (dedup rows of before migration 0021 that `dedup upgrade` moves)
#   BENCHES="produce consume"   a subset, in this order (default: all eleven)
# Durability is never turned off: acks=all everywhere, and MariaDB runs with
# the stack's innodb_flush_log_at_trx_commit (1: fsync per commit), which the
# report records.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ORDERPIPE_BIN:-$ROOT/target/release/orderpipe}"
OUT="$ROOT/target/bench"
SCALE="${SCALE:-1}"
scaled() {
  python3 -c 'import sys; print(max(int(float(sys.argv[1]) * float(sys.argv[2])), int(sys.argv[3])))' "$1" "$SCALE" "$2" \
    || { echo "SCALE=$SCALE: expected a number such as 0.1 or 1" >&2; exit 2; }
}
COUNT="${COUNT:-}"
PRODUCE_COUNT="${PRODUCE_COUNT:-${COUNT:-$(scaled 1000000 1000)}}"
CONSUME_COUNT="${CONSUME_COUNT:-${COUNT:-$(scaled 1000000 1000)}}"
NAIVE="${NAIVE:-$(scaled 50000 500)}"
DLQ_COUNT="${DLQ_COUNT:-${COUNT:-$(scaled 100000 1000)}}"
ORDERING_COUNT="${ORDERING_COUNT:-${COUNT:-$(scaled 100000 1000)}}"
ROWS="${ROWS:-$(scaled 1000000 1000)}"
RATE="${RATE:-100}"
CRASH_COUNT="${CRASH_COUNT:-$(scaled 1000000 1000)}"
DELIVERY_COUNT="${DELIVERY_COUNT:-$(scaled 12000 1000)}"
CDC_ROWS="${CDC_ROWS:-$(scaled 100000 1000)}"
SNAPSHOT_ROWS="${SNAPSHOT_ROWS:-$(scaled 200000 1000)}"
CONSOLE_DEAD="${CONSOLE_DEAD:-$(scaled 100000 1000)}"
UPGRADE_ROWS="${UPGRADE_ROWS:-$(scaled 10000000 1000)}"
BENCHES="${BENCHES:-produce consume dlq relay ordering delivery crash cdc cdc-snapshot console dedup-upgrade}"
for n in "$PRODUCE_COUNT" "$CONSUME_COUNT" "$NAIVE" "$DLQ_COUNT" "$ORDERING_COUNT" "$ROWS" "$RATE" "$CRASH_COUNT" "$DELIVERY_COUNT" "$CDC_ROWS" "$SNAPSHOT_ROWS" "$CONSOLE_DEAD" "$UPGRADE_ROWS"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "sizes must be positive integers, got '$n'" >&2; exit 2; }
done
for b in $BENCHES; do
  [[ " produce consume dlq relay ordering delivery crash cdc cdc-snapshot console dedup-upgrade " == *" $b "* ]] \
    || { echo "BENCHES: unknown benchmark '$b' (accepted: produce consume dlq relay ordering delivery crash cdc cdc-snapshot console dedup-upgrade)" >&2; exit 2; }
done

mkdir -p "$OUT"
exec > >(tee "$OUT/bench.log") 2>&1
export BENCH_RESULTS="$OUT/results.tsv"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml 2>/dev/null || COMMIT="$COMMIT + uncommitted changes in src/"
FLUSH="$(mariadb --protocol=tcp -h127.0.0.1 -P"${ORDERPIPE_MARIADB_PORT:-3306}" -uorderpipe -porderpipe -N -B -e 'SELECT @@innodb_flush_log_at_trx_commit' 2>/dev/null || echo '?')"
sizes="produce $PRODUCE_COUNT, consume $CONSUME_COUNT (naive $NAIVE), dlq $DLQ_COUNT, relay $ROWS rows at $RATE orders/s, ordering $ORDERING_COUNT, delivery $DELIVERY_COUNT, crash $CRASH_COUNT, cdc $CDC_ROWS, cdc snapshot $SNAPSHOT_ROWS, console $CONSOLE_DEAD dead letters, dedup upgrade $UPGRADE_ROWS rows"
# Whether any size is below the full run's: said in the report's head.
reduced() {
  if [ "$PRODUCE_COUNT" -lt 1000000 ] || [ "$CONSUME_COUNT" -lt 1000000 ] || [ "$NAIVE" -lt 50000 ] \
    || [ "$DLQ_COUNT" -lt 100000 ] || [ "$ORDERING_COUNT" -lt 100000 ] || [ "$ROWS" -lt 1000000 ] \
    || [ "$CRASH_COUNT" -lt 1000000 ] || [ "$CDC_ROWS" -lt 100000 ] || [ "$SNAPSHOT_ROWS" -lt 200000 ] || [ "$CONSOLE_DEAD" -lt 100000 ] \
    || [ "$UPGRADE_ROWS" -lt 10000000 ]; then
    echo ": REDUCED sizes, not the full run"
  fi
}
{
  printf 'benchmark\tvariant\tmetric\tvalue\tunit\tpeer\tcommand\n'
  echo "# \`make bench\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT, $(nproc) cores shared by the broker, the registry, MariaDB and the benchmark"
  echo "# sizes: $sizes (SCALE=$SCALE)$(reduced)"
  echo "# durability on: acks=all, idempotent producers, MariaDB innodb_flush_log_at_trx_commit=$FLUSH"
} > "$BENCH_RESULTS"

args_of() {
  case "$1" in
    produce) echo "$PRODUCE_COUNT" ;;
    consume) echo "$CONSUME_COUNT $NAIVE" ;;
    dlq) echo "$DLQ_COUNT" ;;
    relay) echo "$ROWS $RATE" ;;
    ordering) echo "$ORDERING_COUNT" ;;
    delivery) echo "$DELIVERY_COUNT 50" ;;
    crash) echo "$CRASH_COUNT 20" ;;
    cdc) echo "$CDC_ROWS 2000" ;;
    cdc-snapshot) echo "$SNAPSHOT_ROWS 1000" ;;
    console) echo "$CONSOLE_DEAD $((CONSOLE_DEAD / 5)) 10 5" ;;
    dedup-upgrade) echo "$UPGRADE_ROWS" ;;
  esac
}
total=$(wc -w <<<"$BENCHES")
start=$(date +%s)
failed=()
i=0
echo "make bench: $sizes; results in $BENCH_RESULTS"
for b in $BENCHES; do
  i=$((i + 1))
  t0=$(date +%s)
  echo
  echo "######## [$i/$total] bench-$b $(args_of "$b")   (started $(date -u +%H:%M:%S), $((t0 - start)) s into the run)"
  # shellcheck disable=SC2046 # the sizes are separate arguments
  if "$ROOT/dev/bench-$b.sh" $(args_of "$b"); then
    echo "######## [$i/$total] bench-$b done in $(($(date +%s) - t0)) s"
  else
    echo "######## [$i/$total] bench-$b FAILED after $(($(date +%s) - t0)) s (its rows so far stay in the report)"
    failed+=("$b")
  fi
done
echo
echo "######## all benchmarks: $(($(date +%s) - start)) s"
echo "# the run took $(($(date +%s) - start)) s$([ ${#failed[@]} -eq 0 ] || echo "; FAILED: ${failed[*]}")" >> "$BENCH_RESULTS"
# ORDERPIPE_BIN is not a setting (orderpipe would ignore it with a debug line): kept out.
env -u ORDERPIPE_BIN "$BIN" bench-report --results "$BENCH_RESULTS" --out "$OUT" || exit 1
echo
cat "$OUT/report.md"
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}" >&2; exit 1; }
