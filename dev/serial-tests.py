#!/usr/bin/env python3
"""The #[ignore]d tests of tests/it of one kind, by their ignore reason.

    dev/serial-tests.py measurements  -> "serial: a measurement ..." tests
    dev/serial-tests.py serial        -> the other "serial: ..." tests
    dev/serial-tests.py soak          -> "soak: ..." tests
    dev/serial-tests.py manual        -> "manual: ..." tests

as module::name, one per line. make test (dev/test.sh) runs the measurements
first in its serial phase, before its background builds start, so a timing
bound is measured on a quiet machine, then the other serial tests. The soak
tests (the issues' full-size runs: 100k events, twenty kills) are make soak's
(dev/soak.sh); each has a smaller sibling in make test. The manual ones are
run by hand, as their reason says.
The reason is the source of truth, so a new test needs no list; dev/test.sh
fails on an ignored test that no kind claims.
"""
import pathlib
import re
import sys

MEASUREMENT = "serial: a measurement"
KINDS = {
    "measurements": lambda reason: reason.startswith(MEASUREMENT),
    "serial": lambda reason: reason.startswith("serial:") and not reason.startswith(MEASUREMENT),
    "soak": lambda reason: reason.startswith("soak:"),
    "manual": lambda reason: reason.startswith("manual:"),
}
# An ignore attribute, other attributes, then the test's fn.
TEST = re.compile(r'#\[ignore\s*=\s*"([^"]*)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?(?:async\s+)?fn\s+(\w+)', re.S)


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in KINDS:
        print(f"usage: {sys.argv[0]} {{{'|'.join(KINDS)}}}", file=sys.stderr)
        return 2
    belongs = KINDS[sys.argv[1]]
    root = pathlib.Path(__file__).resolve().parent.parent / "tests" / "it"
    for path in sorted(root.glob("*.rs")):
        for reason, name in TEST.findall(path.read_text()):
            if belongs(reason):
                print(f"{path.stem}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
