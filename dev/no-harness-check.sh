#!/usr/bin/env bash
# A build without the cargo feature `harness` (the release image's) has no
# test harness: no `demo`, no `bench-*` commands, no `produce --count`, no
# `chaos` handler, and it refuses a [chaos] config section.
#
#   dev/no-harness-check.sh [BINARY]
#
# BINARY defaults to a debug build without features (`cargo build --bin
# orderpipe`, in the shared target dir: it replaces target/debug/orderpipe).
# make test passes the release binary dev/image.sh built for the image.
# Exit 1 naming the first thing found.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -ge 1 ]]; then
  BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
else
  (cd "$ROOT" && cargo build --quiet --bin orderpipe)
  BIN="$ROOT/target/debug/orderpipe"
fi
fail() { echo "no-harness check: $*" >&2; exit 1; }
# No orderpipe.toml of the caller's, no ORDERPIPE_* of the environment.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
run() { env -u ORDERPIPE_CONFIG "$@" 2>&1; }
for v in $(env | awk -F= '/^ORDERPIPE_/ { print $1 }'); do unset "$v"; done

help="$(run "$BIN" --help)" || fail "$BIN --help failed: $help"
# Not vacuous: the help lists the product's commands.
for command in consume dlq relay; do
  grep -qE "^  $command " <<<"$help" || fail "--help does not list \`$command\`: is $BIN orderpipe?"
done
for command in demo bench-drive-orders bench-order-check bench-naive-consume; do
  if grep -qE "^  $command( |$)" <<<"$help"; then fail "--help lists \`$command\`"; fi
  out="$(run "$BIN" "$command")" && fail "\`orderpipe $command\` ran: $out"
  grep -q "unrecognized subcommand '$command'" <<<"$out" || fail "\`orderpipe $command\`: $out"
done

out="$(run "$BIN" produce --count 1)" && fail "\`produce --count\` ran: $out"
grep -q "unexpected argument '--count'" <<<"$out" || fail "\`produce --count 1\`: $out"

out="$(run "$BIN" consume --group no-harness --handler chaos)" && fail "\`consume --handler chaos\` ran: $out"
# shellcheck disable=SC2016 # backquotes of the message, not an expansion
grep -qF 'unknown handler `chaos`; built-in handlers: inventory, payment, logistics, notification, points' <<<"$out" \
  || fail "\`consume --handler chaos\`: $out"

# [chaos] refused, from a file and from the environment, naming the field;
# the same file without it loads.
printf '[kafka]\nbootstrap_servers = "127.0.0.1:9092"\n' > ok.toml
out="$(run "$BIN" --config ok.toml config)" || fail "\`config\` without [chaos] failed: $out"
printf '[kafka]\nbootstrap_servers = "127.0.0.1:9092"\n[chaos]\npermanent_all = true\n' > chaos.toml
out="$(run "$BIN" --config chaos.toml config)" && fail "a [chaos] section was accepted: $out"
# shellcheck disable=SC2016
grep -q 'chaos: fault injection .* cargo feature `harness`' <<<"$out" || fail "[chaos] in a file: $out"
out="$(run env ORDERPIPE_CHAOS__PERMANENT_ALL=true "$BIN" config)" && fail "ORDERPIPE_CHAOS__PERMANENT_ALL was accepted: $out"
grep -q 'chaos: fault injection' <<<"$out" || fail "ORDERPIPE_CHAOS__* in the environment: $out"

echo "no-harness check: $BIN has no demo, bench-* commands, produce --count or chaos handler, and refuses [chaos]"
