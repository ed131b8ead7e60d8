#!/usr/bin/env python3
"""Fails when the modules under src/ import each other in a circle, or when
the files of one folder do.

Top level: a module is a top-level entry of src/ (`src/retry/…` and
`src/retry.rs` are both `retry`), and one level deeper for `kafka/` (the
ground floor is checked piece by piece). An edge A -> B is any `crate::B`
path in A's files: `use crate::B::…`, `use crate::{B, …}` and inline
`crate::B::x(…)` alike. `src/cli` and `src/bin` sit on top and may import
anything; nothing may import them, which the cycle check then also enforces.

Folders: within every folder under src/ (`src/bin` aside), each child file
(`consumer/dispatch.rs`) is a node, and each child folder is one node with
all its files (`consumer/worker/`, its `mod.rs` included). An edge A -> B is
a path in A's files that names sibling B: `super::B`, `super::super::B` (from
a file one folder deeper), `crate::<folder>::B`, in `use` trees with braces
too. `crate::`, `super::` and `self::` paths resolve as in Rust: a `mod.rs`
is its folder's module, so its `super` is one folder up (`super::dispatch`
in `consumer/worker/mod.rs` is `consumer::dispatch`: an edge
`consumer::worker -> consumer::dispatch`) and its `self::x` is its child x;
an inline `mod x { … }` block is a level of its own. Comments and string
literals are not read. The folder's root (its `mod.rs`, or `db.rs` for
`db/`) declares the children and is no node: a child's `super::Item` names
the root, not a sibling, and an item the root re-exports or imports is not
followed to the sibling that defines it.

In both checks a `#[cfg(test)] mod tests` (and what follows it) is not read:
tests may reach anything; they are not the design.
Usage: dev/import-cycles.py [--graph] [--folder-graph] [--src DIR]   (exit 1 on a circle)
       dev/import-cycles.py --self-test   (shows both checks can fail)
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


def without_tests(text: str) -> str:
    """The text up to its `#[cfg(test)] mod tests`: test modules may reach
    anything; they are not the design."""
    return re.split(r"#\[cfg\(test\)\](?:\s*(?://[^\n]*|#\[[^\]]*\]))*\s*mod tests", text)[0]


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
        g[m] |= targets(without_tests(strip_comments(p.read_text())), known) - {m}
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


# Circles between the files of one folder.

# What is not code: comments (nested block ones too), string literals (raw and
# byte ones too) and char literals; a lifetime (`'a`) has no closing quote.
NOT_CODE = re.compile(
    r"""//[^\n]*|/\*|(?<!\w)b?r(?P<hashes>\#*)"|(?<!\w)b?"(?:\\.|[^"\\])*\""""
    r"""|(?<!\w)b?'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^'\\])'""",
    re.S,
)
PATH_START = re.compile(r"(?<![\w$:])(?:crate|super|self)::")
IDENT = re.compile(r"\s*(?:r#)?([A-Za-z_][A-Za-z0-9_]*)")
SEPARATOR = re.compile(r"\s*::\s*")


def code_only(text: str) -> str:
    """The text with comments and literals blanked (line breaks kept, so a
    line number stays true, and a brace or a path in a string is no code)."""
    out, i = [], 0
    while m := NOT_CODE.search(text, i):
        end = m.end()
        if m.group(0) == "/*":
            depth = 1
            while depth and end < len(text):
                if text.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif text.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
        elif m.group("hashes") is not None:
            close = text.find('"' + m.group("hashes"), end)
            end = len(text) if close < 0 else close + 1 + len(m.group("hashes"))
        out += [text[i:m.start()], re.sub(r"[^\n]", " ", text[m.start():end])]
        i = end
    return "".join(out) + text[i:]


def module_path(path: pathlib.Path) -> tuple[str, ...] | None:
    """`src/consumer/worker/mod.rs` is ("consumer", "worker"), `src/lib.rs`
    is (); None for the crates of src/bin."""
    rel = path.relative_to(SRC).parts
    if rel[0] == "bin":
        return None
    parts = [*rel[:-1], rel[-1].removesuffix(".rs")]
    if parts[-1] == "mod":
        parts.pop()
    return () if parts in (["lib"], ["main"]) else tuple(parts)


def use_tree(text: str, i: int) -> tuple[list[list[str]], int]:
    """The paths of the path or `use` tree at text[i:] (`a::{b, c::d}` is
    [a, b] and [a, c, d]), as lists of segments, and where it ends."""
    segments = []
    while m := IDENT.match(text, i):
        segments.append(m.group(1))
        sep = SEPARATOR.match(text, m.end())
        if not sep:
            return [segments], m.end()
        i = sep.end()
        if text.startswith("*", i):
            return [segments], i + 1
        if text.startswith("{", i):
            paths, i = [], i + 1
            while True:
                sub, i = use_tree(text, i)
                paths += [segments + s for s in sub]
                depth = 0  # past `as x` to the item's end
                while i < len(text) and (depth or text[i] not in ",}"):
                    depth += {"{": 1, "}": -1}.get(text[i], 0)
                    i += 1
                if i >= len(text) or text[i] == "}":
                    return paths, i + 1
                i += 1
    return [segments], i


def inline_modules(text: str) -> list[tuple[int, int, str]]:
    """Where each inline `mod x { … }` block of the (code only) text is."""
    spans = []
    for m in re.finditer(r"\bmod\s+([A-Za-z_]\w*)\s*\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        spans.append((m.end(), i, m.group(1)))
    return spans


def references(text: str, module: tuple[str, ...]):
    """Every `crate::`, `super::` and `self::` path of a file of `module`,
    as the module path it names, with its line and its text."""
    spans = inline_modules(text)
    for m in PATH_START.finditer(text):
        here = module + tuple(name for a, b, name in spans if a <= m.start() < b)
        paths, end = use_tree(text, m.start())
        line = text.count("\n", 0, m.start()) + 1
        shown = " ".join(text[m.start():end].split())
        for segments in paths:
            named = ()
            for k, seg in enumerate(segments):
                if seg == "crate" and k == 0:
                    named = ()
                elif seg == "super":
                    named = (here if k == 0 else named)[:-1]
                elif seg == "self":
                    named = here if k == 0 else named
                else:
                    named += (seg,)
            yield named, line, shown


def folder_graphs() -> dict[tuple[str, ...], dict[str, dict[str, list[str]]]]:
    """For every folder, the edges between its children: folder -> node ->
    sibling -> the places (`file:line path`) that make the edge."""
    files = {p: m for p in sorted(SRC.rglob("*.rs")) if (m := module_path(p)) is not None}
    children: dict[tuple[str, ...], set[str]] = {}
    for m in files.values():
        for n in range(1, len(m)):
            children.setdefault(m[:n], set()).add(m[n])
    name = "::".join
    out = {d: {name(d + (c,)): {} for c in kids} for d, kids in children.items()}
    for p, m in files.items():
        for named, line, shown in references(without_tests(code_only(p.read_text())), m):
            # At each level above the file: its node there -> the sibling named.
            for n in range(1, len(m)):
                d = m[:n]
                if len(named) > n and named[:n] == d and named[n] in children[d] and named[n] != m[n]:
                    places = out[d][name(d + (m[n],))].setdefault(name(d + (named[n],)), [])
                    place = f"{p.relative_to(SRC.parent)}:{line} {shown}"
                    if place not in places:
                        places.append(place)
    return out


def folder_cycles(graphs) -> list[tuple[tuple[str, ...], list[str]]]:
    """The circles of every folder, with the folder."""
    return [
        (d, comp)
        for d in sorted(graphs)
        for comp in cycles({node: set(edges) for node, edges in graphs[d].items()})
    ]


def self_test() -> int:
    """Top level: a tree with a circle through a `use` line, a braced use
    and an inline path must fail; the same tree without the back edge must
    pass. Folders: a tree with a circle between sibling files (through a
    nested braced use, a `crate::<folder>::` path and a `mod.rs` whose
    `super` is one folder up) and one between the files of a subfolder
    (from an inline module, `super::super::`) must fail with just those two;
    with the back edges only in test modules, strings and comments, it must
    pass."""
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
    with tempfile.TemporaryDirectory() as tmp:
        SRC = pathlib.Path(tmp)
        (SRC / "c" / "w").mkdir(parents=True)
        (SRC / "lib.rs").write_text("pub mod c;")
        # The root: its paths to its children and theirs to it are no edges.
        (SRC / "c" / "mod.rs").write_text("mod a; mod b; mod w;\npub struct Shared;\nuse self::w::Go;\n")
        (SRC / "c" / "a.rs").write_text("use super::{Shared, b::{self, Thing}};\n")
        (SRC / "c" / "b.rs").write_text(
            'const S: &str = r#"{ super::a }"#;\nconst T: &str = "super::a";\n'
            "/* super::a /* nested */ */\npub fn g() { crate::c::w::go(); }\n"
        )
        (SRC / "c" / "w" / "mod.rs").write_text("mod x; mod y;\npub fn go() { super::a::h(); }\n")
        (SRC / "c" / "w" / "x.rs").write_text("use super::y::Y;\nuse super::super::Shared;\n")
        (SRC / "c" / "w" / "y.rs").write_text("mod inner {\n    fn f() { super::super::x::g(); }\n}\n")
        found = folder_cycles(folder_graphs())
        expected = [(("c",), ["c::a", "c::b", "c::w"]), (("c", "w"), ["c::w::x", "c::w::y"])]
        if found != expected:
            print(f"self-test: expected the circles {expected} between the files of a folder; found {found}")
            return 1
        (SRC / "c" / "w" / "mod.rs").write_text(
            "mod x; mod y;\npub fn go() {}\n#[cfg(test)]\nmod tests { use super::super::a; }\n"
        )
        (SRC / "c" / "w" / "y.rs").write_text("pub struct Y;\n#[cfg(test)]\nmod tests { use crate::c::w::x; }\n")
        if found := folder_cycles(folder_graphs()):
            print(f"self-test: a folder without a circle was reported as one: {found}")
            return 1
    print(
        "import-cycles self-test: a circle is found, among modules and between the"
        " files of a folder; a test-only edge is not"
    )
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
    graphs = folder_graphs()
    if "--folder-graph" in sys.argv:
        for d in sorted(graphs):
            for node in sorted(graphs[d]):
                print(f"{node} -> {', '.join(sorted(graphs[d][node])) or '-'}")
    found = cycles(g)
    if not found:
        print(f"import-cycles: {len(g)} modules, no circle")
    for comp in found:
        inner = {m: sorted(g[m] & set(comp)) for m in comp}
        print("import circle among: " + ", ".join(comp))
        for m in comp:
            print(f"  {m} -> {', '.join(inner[m])}")
    found_in_folders = folder_cycles(graphs)
    if not found_in_folders:
        nodes = sum(len(nodes) for nodes in graphs.values())
        print(f"import-cycles: {len(graphs)} folders ({nodes} files and subfolders), no circle between the files of one")
    for d, comp in found_in_folders:
        print(f"import circle in src/{'/'.join(d)}/ among: " + ", ".join(comp))
        for m in comp:
            for target in sorted(set(graphs[d][m]) & set(comp)):
                for place in graphs[d][m][target]:
                    print(f"  {m} -> {target}: {place}")
    return 1 if found or found_in_folders else 0


if __name__ == "__main__":
    sys.exit(main())
