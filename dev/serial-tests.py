#!/usr/bin/env python3
"""The serial tests of tests/it whose #[ignore] reason starts with a kind.

    dev/serial-tests.py measurements   -> each "serial: a measurement ..." test
    dev/serial-tests.py manual         -> each "manual: ..." test

as module::name. make test (dev/test.sh) runs the measurements first in its
serial phase, before its background builds start, so a timing bound is
measured on a quiet machine; it skips the manual ones (run by hand, as their
reason says).
The reason is the source of truth, so a new measurement test needs no list.
"""
import pathlib
import re
import sys

KINDS = {"measurements": "serial: a measurement", "manual": "manual:"}
# An ignore attribute, other attributes, then the test's fn.
TEST = re.compile(r'#\[ignore\s*=\s*"([^"]*)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?(?:async\s+)?fn\s+(\w+)', re.S)


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in KINDS:
        print(f"usage: {sys.argv[0]} {{{'|'.join(KINDS)}}}", file=sys.stderr)
        return 2
    prefix = KINDS[sys.argv[1]]
    root = pathlib.Path(__file__).resolve().parent.parent / "tests" / "it"
    for path in sorted(root.glob("*.rs")):
        for reason, name in TEST.findall(path.read_text()):
            if reason.startswith(prefix):
                print(f"{path.stem}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
