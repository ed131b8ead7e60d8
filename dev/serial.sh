#!/usr/bin/env bash
# Runs the named #[ignore]d tests of tests/it one at a time, each timed, and
# prints the table of their times. A failed test does not stop the others;
# the exit status is 1 when any failed.
#
#   dev/serial.sh NAME...                  # the binary: dev/test-binaries.sh it
#   IT_BINARY=... dev/serial.sh NAME...
#
# dev/test.sh (make test) and dev/soak.sh (make soak) call it. The binary
# runs directly, from the crate root as cargo runs it.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
IT_BINARY="${IT_BINARY:-$("$ROOT/dev/test-binaries.sh" it)}"
[[ -x "$IT_BINARY" ]] || { echo "error: no test binary for tests/it ($IT_BINARY)" >&2; exit 1; }
times=() failed=()
for name in "$@"; do
  start=$SECONDS rc=0
  echo "-- serial: $name"
  "$IT_BINARY" --ignored --exact --test-threads=1 "$name" || rc=$?
  # A failed test that stops a service (MariaDB, Kafka) may leave it
  # stopped: start it again, so one failure does not fail every test after.
  (( rc == 0 )) || "$ROOT/dev/stack.sh" up >/dev/null 2>&1 || true
  times+=("$(printf '%5ss  %-4s %s' $((SECONDS - start)) "$( ((rc)) && echo FAIL || echo ok)" "$name")")
  (( rc == 0 )) || failed+=("$name")
done
echo "== serial tests: $# run, ${#failed[@]} failed"
printf '   %s\n' "${times[@]}"
(( ${#failed[@]} == 0 )) || { printf 'failed: %s\n' "${failed[@]}" >&2; exit 1; }
