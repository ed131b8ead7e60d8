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

echo "== no import circle among src/ modules (dev/import-cycles.py)"
python3 "$ROOT/dev/import-cycles.py" --self-test
python3 "$ROOT/dev/import-cycles.py"

"$STACK" deps
echo "== cargo fmt --check"
cargo fmt --check
echo "== building tests"
cargo build --features harness --tests --bins
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --features harness --all-targets -- -D warnings

if "$STACK" status >/dev/null 2>&1; then
  echo "== stack already running: reusing it, leaving it running afterwards"
  started=0
else
  started=1
fi
stop_stack() {
  if (( started )); then
    echo "== stopping the stack this run started"
    "$STACK" down || true
  fi
}
trap stop_stack EXIT
"$STACK" up

# What the tests of earlier runs left on a reused stack: each test has its own
# topics (t<hex>.*, 12 partitions each) and database (op_t<hex>). A few runs'
# worth of partitions exhaust the broker's open files (it then fails to
# start), and the databases fill MariaDB's buffer pool.
echo "== deleting the topics (t<hex>.*) and databases (op_t<hex>) of earlier test runs"
"$STACK" kafka-topics --delete --if-exists --topic 't[0-9a-f]{10}[.].*' >/dev/null \
  || echo "warning: the earlier test topics were not deleted; the broker may run out of open files" >&2
for db in $("$STACK" sql -N -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name REGEXP '^op_t[0-9a-f]{10}\$'"); do
  "$STACK" sql -e "DROP DATABASE \`$db\`"
done

echo "== Helm chart and alert rules"
"$ROOT/dev/chart-test.sh"

echo "== unit and integration tests"
cargo test --features harness --all-targets
echo "== serial integration tests (one at a time)"
cargo test --features harness --test it -- --ignored --test-threads=1

# The chart's image: the Dockerfile built with buildah (no daemon) and run as
# UID 10001 against the stack; most of its time is the release build.
echo "== image (dev/image.sh): Dockerfile built with buildah, consume as UID 10001"
"$ROOT/dev/image.sh"

# The image's binary (target/release/orderpipe, built without features) has
# no demo, bench-* commands, produce --count or chaos handler; the same check
# fails on the harness build, so it can fail.
echo "== no harness in the release build (dev/no-harness-check.sh)"
"$ROOT/dev/no-harness-check.sh" "$ROOT/target/release/orderpipe"
if "$ROOT/dev/no-harness-check.sh" "$ROOT/target/debug/orderpipe" >/dev/null 2>&1; then
  echo "dev/no-harness-check.sh passed on the harness build target/debug/orderpipe" >&2
  exit 1
fi

# Last: building with the feature changes target/debug/orderpipe, which the
# tests above use (a target dir of its own would cost a full second build).
echo "== OTLP export: the release image's binary (--features otlp, no harness) consumes and exports its spans"
OTLP_CONSUMER_BINARY="$ROOT/target/release/orderpipe" cargo test --features otlp,harness --test otlp -- --nocapture
