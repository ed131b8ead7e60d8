#!/usr/bin/env bash
# The executables of the crate's test targets, built with the harness
# feature (`cargo build --features harness --tests`), one per line:
#
#   dev/test-binaries.sh        # every target's: the lib's and bin's unit tests, tests/it, tests/otlp
#   dev/test-binaries.sh it     # tests/it's
#
# make test runs them directly, from the crate root as cargo does: a
# `cargo test` would wait on the build lock its background clippy holds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --features harness --all-targets --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json, sys
only = sys.argv[1] if len(sys.argv) > 1 else None
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and (only is None or m["target"]["name"] == only):
        print(m["executable"])' "$@"
