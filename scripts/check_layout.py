#!/usr/bin/env python3
"""The layout check: no import circle between a crate's files, no file over
the line limit, a module doc on every file.

Reads the Rust sources of each crate named on the command line (default: the
gateway) and draws an edge from file A to file B whenever A names an item of
B by path: `use crate::…`, `use super::…`, `use self::…`, an inline
`crate::x::y` / `super::x` path, or a `pub use child::…` re-export. `mod x;`
declarations alone are structure, not use, and draw no edge. Test code is
left out: `#[cfg(test)]` items (and the files declared `#[cfg(test)] mod x;`)
neither count towards the limit nor draw edges.

A path resolves to the deepest module file it names (`crate::a::b::C` is
`a/b.rs` when that file exists, else `a.rs` or `a/mod.rs`).

Lines counted towards the limit: non-blank lines that are not comments
(`//`, `//!`, `///`, `/* … */`), outside test items.

Usage: `scripts/check_layout.py [--root REPO] [--layers] [CRATE_DIR …]`
(default: the gateway of the repository holding this script); `--layers`
also prints the top-level modules by layer. Circles are looked for between
files, and again between top-level modules (a folder counts as one).

Exit status 1 with every circle and every oversized or undocumented file
listed; 0 and a one-line summary otherwise.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

MAX_CODE_LINES = 700

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(src: str) -> str:
    """Blank out comments, string and char literals, keeping line breaks."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", src[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def test_spans(code: str) -> list[tuple[int, int]]:
    """Character spans of items under `#[cfg(test)]` (a block or a `mod x;`)."""
    spans = []
    for m in re.finditer(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", code):
        j = m.end()
        # Skip further attributes.
        while True:
            k = re.match(r"\s*#\s*\[", code[j:])
            if not k:
                break
            depth, p = 1, j + k.end()
            while p < len(code) and depth:
                depth += {"[": 1, "]": -1}.get(code[p], 0)
                p += 1
            j = p
        # The item runs to its matching closing brace, or to `;` if first.
        p = j
        while p < len(code) and code[p] not in "{;":
            p += 1
        if p < len(code) and code[p] == "{":
            depth = 1
            p += 1
            while p < len(code) and depth:
                depth += {"{": 1, "}": -1}.get(code[p], 0)
                p += 1
        else:
            p += 1
        spans.append((m.start(), p))
    return spans


def blank_spans(code: str, spans: list[tuple[int, int]]) -> str:
    chars = list(code)
    for a, b in spans:
        for i in range(a, min(b, len(chars))):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


class Crate:
    def __init__(self, root: Path):
        self.src = root / "src"
        self.files: dict[tuple[str, ...], Path] = {}  # module path -> file
        self.code: dict[tuple[str, ...], str] = {}  # module path -> non-test code
        self.test_files: set[Path] = set()
        lib = self.src / "lib.rs"
        self._load(("crate",), lib if lib.exists() else self.src / "main.rs")

    def _child_file(self, parent_file: Path, parent: tuple[str, ...], name: str, attr_path: str | None) -> Path | None:
        if attr_path:
            return parent_file.parent / attr_path
        if parent_file.name in ("lib.rs", "main.rs", "mod.rs"):
            base = parent_file.parent
        else:
            base = parent_file.parent / parent_file.stem
        for cand in (base / f"{name}.rs", base / name / "mod.rs"):
            if cand.exists():
                return cand
        return None

    def _load(self, modpath: tuple[str, ...], file: Path) -> None:
        raw = file.read_text()
        stripped = strip_comments_and_strings(raw)
        tests = test_spans(stripped)
        code = blank_spans(stripped, tests)
        self.files[modpath] = file
        self.code[modpath] = code
        for m in re.finditer(r"(#\s*\[[^\]]*\]\s*)*(pub(\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", stripped):
            name = m.group(4)
            in_test = any(a <= m.start() < b for a, b in tests)
            attrs = raw[m.start():m.end()]
            pm = re.search(r'#\s*\[\s*path\s*=\s*"([^"]+)"', attrs)
            child = self._child_file(file, modpath, name, pm.group(1) if pm else None)
            if child is None:
                continue
            if in_test:
                self._mark_test(child)
            else:
                self._load(modpath + (name,), child)

    def _mark_test(self, file: Path) -> None:
        self.test_files.add(file)

    def resolve(self, here: tuple[str, ...], path: list[str]) -> tuple[str, ...] | None:
        """The module file a `::` path names, from module `here`."""
        if not path:
            return None
        if path[0] == "crate":
            base: tuple[str, ...] = ("crate",)
            rest = path[1:]
        elif path[0] in ("super", "self"):
            base = here
            rest = path
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
        else:
            # A path relative to this module: `child::x`.
            base, rest = here, path
            if (here + (path[0],)) not in self.files:
                return None
        best = base if base in self.files else None
        cur = base
        for seg in rest:
            cur = cur + (seg,)
            if cur in self.files:
                best = cur
            else:
                break
        return best

    def edges(self) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
        graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in self.files}
        for mod, code in self.code.items():
            targets = set()
            for use in re.finditer(r"\buse\s+([^;]+);", code):
                for p in expand_use(use.group(1)):
                    t = self.resolve(mod, p)
                    if t:
                        targets.add(t)
            for m in re.finditer(r"\b((?:crate|super|self)(?:\s*::\s*" + IDENT + r")+)", code):
                p = [s.strip() for s in m.group(1).split("::")]
                t = self.resolve(mod, p)
                if t:
                    targets.add(t)
            targets.discard(mod)
            # A module naming its own ancestor through `super::` to reach a
            # sibling resolves to the sibling; naming the ancestor file itself
            # is a real edge.
            graph[mod] = targets
        return graph


def expand_use(tree: str) -> list[list[str]]:
    """`a::{b, c::{d, e as f}, self}` → [[a,b], [a,c,d], [a,c,e], [a]]."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)

    def parse(s: str, prefix: list[str]) -> list[list[str]]:
        out = []
        for part in split_top(s):
            if not part:
                continue
            brace = part.find("{")
            if brace >= 0:
                head = [x for x in part[:brace].split("::") if x]
                out.extend(parse(part[brace + 1:-1], prefix + head))
            else:
                segs = [x for x in part.split("::") if x and x != "*"]
                if segs == ["self"]:
                    out.append(prefix)
                else:
                    out.append(prefix + segs)
        return out

    return parse(tree, [])


def split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def cycles(graph: dict) -> list[list]:
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def one_cycle(graph: dict, comp: list) -> list:
    """A shortest circle through the component's first file, for the report."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def layer_of(graph: dict) -> dict:
    """Modules grouped by their height: 1 for those that use no other."""
    height: dict = {}

    def h(v, seen=()):
        if v not in height:
            below = [h(w, seen + (v,)) for w in graph.get(v, ()) if w not in seen and w[1:]]
            height[v] = 1 + max(below, default=0)
        return height[v]

    out: dict = {}
    for v in graph:
        if len(v) > 1:
            out.setdefault(h(v), []).append(v)
    return out


def code_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip() and line.strip() not in ("",))


def main(argv: list[str]) -> int:
    args = argv[1:]
    repo = Path(__file__).resolve().parent.parent
    if args[:1] == ["--root"]:
        repo, args = Path(args[1]), args[2:]
    layers = args[:1] == ["--layers"]
    if layers:
        args = args[1:]
    crates = args or ["gateway"]
    problems = []
    summary = []
    for name in crates:
        crate = Crate(repo / name)
        graph = crate.edges()
        rel = lambda m: os.path.relpath(crate.files[m], repo)
        for comp in cycles(graph):
            circle = " -> ".join(rel(m) for m in one_cycle(graph, comp))
            problems.append(f"import circle among {len(comp)} files of {name}: {circle}\n    all: {', '.join(rel(m) for m in comp)}")
        # The same between top-level modules (a folder counts as one): a
        # layer's files may use each other, but no module climbs back up.
        top = {}
        for mod, targets in graph.items():
            a = mod[:2]
            top.setdefault(a, set())
            for t in targets:
                if t[:2] != a and len(a) > 1 and len(t) > 1:
                    top[a].add(t[:2])
        for comp in cycles(top):
            circle = " -> ".join("::".join(m[1:]) for m in one_cycle(top, comp))
            problems.append(f"import circle among the top-level modules of {name}: {circle}")
        if layers:
            print(f"{name}, top-level modules by layer (each uses only those below it):")
            for depth, mods in sorted(layer_of(top).items(), reverse=True):
                print(f"  {depth}: " + ", ".join(sorted("::".join(m[1:]) for m in mods)))
        longest = (0, "")
        for mod, code in crate.code.items():
            n = code_lines(code)
            longest = max(longest, (n, rel(mod)))
            if n > MAX_CODE_LINES:
                problems.append(f"{rel(mod)}: {n} lines of non-test code (limit {MAX_CODE_LINES})")
            first = crate.files[mod].read_text().lstrip()
            if not first.startswith("//!"):
                problems.append(f"{rel(mod)}: no `//!` module doc saying what it owns")
        summary.append(f"{name}: {len(crate.files)} files, no circle, longest {longest[1]} ({longest[0]} lines)")
    if problems:
        print("\n".join(problems))
        print(f"layout check: {len(problems)} problem(s)")
        return 1
    print("layout check: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
