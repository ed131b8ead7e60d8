#!/usr/bin/env bash
# `make test`: install what is missing, start the real stack (Kafka, Apicurio
# Registry, MariaDB), run every test, and stop what this run started, even
# when a test fails.
#
# Phases: unit tests and parallel integration tests, then the serial tests
# (`#[ignore]`d: they stop shared services or load the machine) one at a time.
# The tests drive the test harness (demo, produce --count, the chaos handler):
# everything is built with the cargo feature `harness`, except the release
# image, which is then checked to have none of it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$ROOT/dev/stack.sh"
cd "$ROOT"

# Phase timings: `phase NAME` ends the phase before it; the table prints at
# exit, failed or not, so a slow or failing run shows where its time went.
PHASES=()
phase_name="" phase_start=$SECONDS
phase() {
  [[ -n "$phase_name" ]] && PHASES+=("$(printf '%-58s %5ss' "$phase_name" $((SECONDS - phase_start)))")
  phase_name="$1" phase_start=$SECONDS
  echo "== $1"
}
print_phases() {
  [[ -n "$phase_name" ]] && phase "(end)" >/dev/null
  echo "== phase timings (total ${SECONDS}s)"
  printf '   %s\n' "${PHASES[@]}"
}

# A fresh clone's builds (debug with the harness, release for the image, the
# OTLP variant) and the image's vfs layers take about 15 GB. Running out half
# way fails in rustc with "No space left on device" after minutes of work;
# say so up front instead.
min_free_gb="${ORDERPIPE_TEST_MIN_FREE_GB:-20}"
free_gb=$(( $(df -Pk "$ROOT" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
if (( free_gb < min_free_gb )); then
  echo "error: make test needs about ${min_free_gb} GB free on the disk of $ROOT; ${free_gb} GB is free." >&2
  echo "       Free space (old target/ directories, /tmp clones), or set ORDERPIPE_TEST_MIN_FREE_GB." >&2
  exit 1
fi
echo "== disk: ${free_gb} GB free (needs about ${min_free_gb})"

phase "no import circle among src/ modules, nor between the files of a folder (dev/import-cycles.py)"
python3 "$ROOT/dev/import-cycles.py" --self-test
python3 "$ROOT/dev/import-cycles.py"

phase "apt packages, Kafka jars, Apicurio (dev/stack.sh deps)"
"$STACK" deps
phase "cargo fmt --check"
cargo fmt --check
phase "building tests"
cargo build --features harness --tests --bins
# clippy and the image's release build run in the background, at the
# lowest CPU priority, from after the measurement tests (which need a quiet
# machine) to the end of the serial phase: the tests mostly wait (Kafka
# rebalances, outages, kills), and the two builds are a quarter of a fresh
# run's time when run in line. The tests run from their binaries, not with
# `cargo test`, which would wait on the build lock clippy holds. A failure
# of either build fails the run after the tests.
BACKGROUND_PID=""
BACKGROUND_LOG="$ROOT/target/make-test-background.log"
start_background_builds() {
  echo "== background, nice 19: cargo clippy, then the image's release build (log: $BACKGROUND_LOG)"
  (
    set +e
    nice -n 19 cargo clippy --features harness --all-targets -- -D warnings
    echo "clippy rc=$?"
    # dev/image.sh runs this same command; it then finds nothing to do.
    nice -n 19 cargo build --release --locked --features otlp --bin orderpipe
    echo "release rc=$?"
  ) >"$BACKGROUND_LOG" 2>&1 &
  BACKGROUND_PID=$!
}
wait_background_builds() {
  phase "waiting for the background builds: clippy, release"
  wait "$BACKGROUND_PID" || true
  BACKGROUND_PID=""
  local ok=1
  grep -qx 'clippy rc=0' "$BACKGROUND_LOG" || { echo "cargo clippy failed:" >&2; ok=0; }
  grep -qx 'release rc=0' "$BACKGROUND_LOG" || { echo "the release build failed:" >&2; ok=0; }
  if (( ! ok )); then
    grep -v '^ *\(Compiling\|Checking\) ' "$BACKGROUND_LOG" | tail -n 60 >&2
    exit 1
  fi
}

if "$STACK" status >/dev/null 2>&1; then
  echo "== stack already running: reusing it, leaving it running afterwards"
  started=0
else
  started=1
fi
on_exit() {
  local rc=$?
  # (an if, not &&: a failed kill of a finished build must not end the trap under set -e)
  if [[ -n "$BACKGROUND_PID" ]]; then kill -- "$BACKGROUND_PID" 2>/dev/null || true; fi
  if (( started )); then
    echo "== stopping the stack this run started"
    "$STACK" down || true
  fi
  print_phases
  exit "$rc"
}
trap on_exit EXIT
phase "the stack (dev/stack.sh up)"
"$STACK" up

# What the tests of earlier runs left on a reused stack: each test has its own
# topics (t<hex>.*, 12 partitions each) and database (op_t<hex>). A few runs'
# worth of partitions exhaust the broker's open files (it then fails to
# start), and the databases fill MariaDB's buffer pool.
#
# A deletion is done when the broker has closed and renamed every partition
# (its `<topic>-<n>` directory becomes `...-delete`): until then a single
# broker stalls for tens of seconds (a transactional commit took 28 s after
# 400 topics were deleted, and a cdc started then found its new offsets
# topic missing), so the next test waits for it.
KAFKA_DATA="${ORDERPIPE_STACK_DIR:-$ROOT/.stack}/kafka/data"
delete_test_leftovers() {
  local round left
  for round in $(seq 1 60); do
    "$STACK" kafka-topics --delete --if-exists --topic 't[0-9a-f]{10}[.].*' >/dev/null 2>&1 || true
    # (find complains of the directories the broker renames under it)
    left=$({ find "$KAFKA_DATA" -maxdepth 1 -regextype posix-extended -regex '.*/t[0-9a-f]{10}[.].*-[0-9]+' 2>/dev/null || true; } | wc -l)
    (( left == 0 )) && break
    echo "   $left partitions of earlier tests' topics still open on the broker (round $round)"
    sleep 5
  done
  (( left == 0 )) || echo "warning: $left partitions of earlier test topics are still on the broker; it may run out of open files" >&2
  for db in $("$STACK" sql -N -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name REGEXP '^op_t[0-9a-f]{10}\$'"); do
    "$STACK" sql -e "DROP DATABASE \`$db\`"
  done
}
phase "deleting the topics (t<hex>.*) and databases (op_t<hex>) of earlier test runs"
delete_test_leftovers

# The #[ignore]d tests of tests/it by kind (dev/serial-tests.py reads their
# ignore reasons): the measurements and the other serial tests run here one
# at a time, each timed (dev/serial.sh); the soak tests are make soak's, the
# manual ones are run by hand.
mapfile -t TEST_BINARIES < <("$ROOT/dev/test-binaries.sh")
IT_BINARY="$(printf '%s\n' "${TEST_BINARIES[@]}" | grep '/it-[0-9a-f]*$' || true)"
export IT_BINARY
[[ -x "$IT_BINARY" ]] || { echo "error: no test binary for tests/it among: ${TEST_BINARIES[*]}" >&2; exit 1; }
mapfile -t IGNORED < <("$IT_BINARY" --ignored --list --format terse 2>/dev/null | sed -n 's/: test$//p')
declare -A KIND_OF=()
for kind in measurements serial soak manual; do
  while read -r name; do
    [[ " ${IGNORED[*]} " == *" $name "* ]] \
      || { echo "error: dev/serial-tests.py names $name, which $IT_BINARY does not list as ignored" >&2; exit 1; }
    KIND_OF[$name]=$kind
  done < <(python3 "$ROOT/dev/serial-tests.py" "$kind")
done
MEASUREMENTS=() SERIAL=()
for name in "${IGNORED[@]}"; do
  case "${KIND_OF[$name]:-}" in
    measurements) MEASUREMENTS+=("$name") ;;
    serial) SERIAL+=("$name") ;;
    soak|manual) echo "-- not in make test, ${KIND_OF[$name]}: $name" ;;
    *) echo "error: $name is ignored with a reason no kind of dev/serial-tests.py claims" >&2; exit 1 ;;
  esac
done
(( ${#SERIAL[@]} > 0 && ${#MEASUREMENTS[@]} > 0 )) \
  || { echo "error: found ${#SERIAL[@]} serial tests, ${#MEASUREMENTS[@]} measurements" >&2; exit 1; }
(( ${#TEST_BINARIES[@]} >= 3 )) || { echo "error: found only these test binaries: ${TEST_BINARIES[*]}" >&2; exit 1; }

# Measurements (a timing bound, a latency) first, on a quiet machine.
phase "serial measurements (one at a time, a quiet machine)"
serial_failed=0
"$ROOT/dev/serial.sh" "${MEASUREMENTS[@]}" || serial_failed=1
start_background_builds

phase "Helm chart and alert rules (dev/chart-test.sh)"
"$ROOT/dev/chart-test.sh"

# Four at a time on two cores: most tests wait on Kafka (group joins,
# transaction markers, the retry topic's due times), not the CPU.
phase "unit and integration tests (parallel, ${ORDERPIPE_TEST_THREADS:-4} at a time)"
for binary in "${TEST_BINARIES[@]}"; do
  echo "-- $binary"
  "$binary" --test-threads="${ORDERPIPE_TEST_THREADS:-4}"
done

# The parallel phase leaves about 5,000 partitions behind. A serial test that
# SIGKILLs the broker waits for its restart, which recovers every partition
# (over 120 s with 5,000 on this machine, with the background builds
# running): delete them first (no test runs now).
phase "deleting the parallel phase's topics and databases (a broker restart then loads fewer partitions)"
delete_test_leftovers

phase "serial integration tests (one at a time)"
"$ROOT/dev/serial.sh" "${SERIAL[@]}" || serial_failed=1
(( serial_failed == 0 )) || { echo "error: serial tests failed (named in the tables above)" >&2; exit 1; }
wait_background_builds

# The chart's image: the Dockerfile built with buildah (no daemon) and run as
# UID 10001 against the stack (the release build is done by now).
phase "image (dev/image.sh): Dockerfile built with buildah, consume as UID 10001"
"$ROOT/dev/image.sh"

# The image's binary (target/release/orderpipe, built without features) has
# no demo, bench-* commands, produce --count or chaos handler; the same check
# fails on the harness build, so it can fail.
phase "no harness in the release build (dev/no-harness-check.sh)"
"$ROOT/dev/no-harness-check.sh" "$ROOT/target/release/orderpipe"
if "$ROOT/dev/no-harness-check.sh" "$ROOT/target/debug/orderpipe" >/dev/null 2>&1; then
  echo "dev/no-harness-check.sh passed on the harness build target/debug/orderpipe" >&2
  exit 1
fi

# The test is built with the suite; its consumer is the image's binary.
phase "OTLP export: the release image's binary (--features otlp, no harness) consumes and exports its spans"
OTLP_CONSUMER_BINARY="$ROOT/target/release/orderpipe" cargo test --features harness --test otlp -- --ignored --nocapture
