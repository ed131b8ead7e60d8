#!/usr/bin/env bash
# `make soak`: the issues' full-size robustness runs (100k events, twenty
# SIGKILLs, a 60 s database outage), the #[ignore = "soak: ..."] tests of
# tests/it, one at a time, each timed. make test runs a smaller sibling of
# each (docs/testing.md names them); run this before landing a change to the
# consumer, relay, cdc or dead-letter paths. About 20 minutes.
#
#   make soak                    # every soak test
#   make soak ONLY=crash::       # those whose name contains crash::
#
# It starts the stack when none runs (and stops it after), or reuses a
# running one and leaves it running.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$ROOT/dev/stack.sh"
cd "$ROOT"
"$STACK" deps
cargo build --features harness --tests --bins
mapfile -t SOAK < <(python3 "$ROOT/dev/serial-tests.py" soak | grep -F -- "${ONLY:-}")
(( ${#SOAK[@]} > 0 )) || { echo "error: no soak test matches '${ONLY:-}'" >&2; exit 1; }
if "$STACK" status >/dev/null 2>&1; then started=0; else started=1; fi
stop_started() { if (( started )); then "$STACK" down; fi; }
trap stop_started EXIT
"$STACK" up
"$ROOT/dev/serial.sh" "${SOAK[@]}"
