#!/usr/bin/env python3
"""Fails when the modules under src/ import each other in a circle.

A module is a top-level entry of src/ (`src/retry/…` and `src/retry.rs` are
both `retry`), and one level deeper for `kafka/` (the ground floor is
checked piece by piece). An edge A -> B is any `crate::B` path in A's files:
`use crate::B::…`, `use crate::{B, …}` and inline `crate::B::x(…)` alike.
`src/cli` and `src/bin` sit on top and may import anything; nothing may
import them, which the cycle check then also enforces.
Usage: dev/import-cycles.py [--graph] [--src DIR]   (exit 1 on a cycle)
       dev/import-cycles.py --self-test   (shows the check can fail)
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
SPLIT = {"kafka"}  # folders whose children are checked as separate modules


def module_of(path: pathlib.Path) -> str | None:
    rel = path.relative_to(SRC).parts
    if rel[0] in ("lib.rs", "bin"):
        return None
    top = rel[0].removesuffix(".rs")
    if top in SPLIT and len(rel) > 1 and rel[1] != "mod.rs":
        return f"{top}::{rel[1].removesuffix('.rs')}"
    return top


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def targets(text: str, known: set[str]) -> set[str]:
    out = set()
    # crate::a::b and crate::a
    for m in re.finditer(r"crate::([a-z_]+)(?:::([a-z_]+))?", text):
        a, b = m.group(1), m.group(2)
        out.add(f"{a}::{b}" if a in SPLIT and b and f"{a}::{b}" in known else a)
    # use crate::{a, b::c, ...} (one level of braces)
    for m in re.finditer(r"crate::\{([^}]*)\}", text, flags=re.S):
        for item in m.group(1).split(","):
            item = item.strip()
            if not item:
                continue
            parts = item.split("::")
            a = parts[0].strip()
            b = parts[1].strip() if len(parts) > 1 else None
            out.add(f"{a}::{b}" if a in SPLIT and b and f"{a}::{b}" in known else a)
    return {t for t in out if t in known}


def graph() -> dict[str, set[str]]:
    files = [p for p in SRC.rglob("*.rs")]
    known = {m for p in files if (m := module_of(p))}
    g: dict[str, set[str]] = {m: set() for m in known}
    for p in files:
        m = module_of(p)
        if m is None:
            continue
        # #[cfg(test)] modules may reach anything; they are not the design.
        text = strip_comments(p.read_text())
        text = re.split(r"#\[cfg\(test\)\](?:\s*(?://[^\n]*|#\[[^\]]*\]))*\s*mod tests", text)[0]
        g[m] |= targets(text, known) - {m}
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    # Tarjan's strongly connected components; any component of size > 1 is a circle.
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def self_test() -> int:
    """A tree with a circle through a `use` line, a braced use and an
    inline path must fail; the same tree without the back edge must pass."""
    import tempfile
    global SRC
    with tempfile.TemporaryDirectory() as tmp:
        SRC = pathlib.Path(tmp)
        (SRC / "kafka").mkdir()
        (SRC / "lib.rs").write_text("pub mod a; pub mod b; pub mod kafka;")
        (SRC / "a.rs").write_text("use crate::{b::Thing, kafka::record};")
        (SRC / "kafka" / "record.rs").write_text("// crate::a is only a comment\n")
        (SRC / "b.rs").write_text("fn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests { use crate::a; }")
        found = cycles(graph())
        if found != [["a", "b"]]:
            print(f"self-test: expected the circle a, b; found {found}")
            return 1
        (SRC / "b.rs").write_text("fn f() {}\n#[cfg(test)]\n// why\n#[allow(dead_code)]\nmod tests { use crate::a; }")
        if cycles(graph()):
            print("self-test: a tree without a circle was reported as one")
            return 1
    print("import-cycles self-test: a circle is found, a test-only edge is not")
    return 0


def main() -> int:
    if "--self-test" in sys.argv:
        return self_test()
    if "--src" in sys.argv:
        global SRC
        SRC = pathlib.Path(sys.argv[sys.argv.index("--src") + 1]).resolve()
    g = graph()
    if "--graph" in sys.argv:
        for m in sorted(g):
            print(f"{m} -> {', '.join(sorted(g[m])) or '-'}")
    found = cycles(g)
    if not found:
        print(f"import-cycles: {len(g)} modules, no circle")
        return 0
    for comp in found:
        inner = {m: sorted(g[m] & set(comp)) for m in comp}
        print("import circle among: " + ", ".join(comp))
        for m in comp:
            print(f"  {m} -> {', '.join(inner[m])}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
