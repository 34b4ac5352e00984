#!/usr/bin/env python3
"""Checks the core crate's import rules (native/couch_workers_core/src).

The graph: a module depends on another when its code names it: a `use`
of `crate::`, `super::`, `self::` or a child module, or such a path
written out in the code. A path is followed through `use` aliases and
re-exports to the module that defines the item, so a re-export never
hides where a name comes from. Not edges: a parent's `pub use` of its own
children (its facade); a child's use of what its parent module defines
(the container that the child is a part of, such as the embedded store's
handle that each of its files works on: a circle is between peers);
`#[cfg(test)]` items (a module's unit tests may set up anything);
comments and strings.

Nodes: the top-level modules of lib.rs's map; inside `jobs/` and
`store/`, each file. It fails on
  * an import of a module from one in the same or a lower layer of
    LAYERS (modules of one layer are side by side: neither imports the
    other), or of a module that LAYERS does not list;
  * a circle between top-level modules, or between files of `jobs/` or of
    `store/`;
  * an ALLOWED entry that no longer matches an import (remove it);
  * a Rust file of any crate under native/ over MAX_LINES lines (split it
    by job, as jobs/dispatcher/ or keyspace/ are).

Usage: scripts/check-layers.py [--edges] [SRC]
(--edges prints the graph; SRC: another checkout's core sources)
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native", "couch_workers_core", "src")

# Bottom first. A module may import only modules of lower layers.
LAYERS = [
    ["stage", "metrics"],
    ["log"],
    ["store"],
    ["error", "keyspace"],
    ["tasks"],
    ["context"],
    ["workers", "jobs", "inspect"],
    ["liveness", "roster", "leadership"],
    ["schedules"],
    ["services"],
    ["node"],
    ["conformance", "test_store"],
    ["conformance_keyspace"],
]

# Known imports that break the rules, (from, to, why), each to be fixed:
# the check fails once an entry matches nothing.
ALLOWED = []

# Top-level modules whose files are nodes of their own.
FILE_LEVEL = ("jobs", "store")


def strip(text):
    """Blanks comments, strings and char literals, keeping line breaks."""
    out = []
    i, n = 0, len(text)
    blank = lambda s: re.sub(r"[^\n]", " ", s)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'", text[i:])):
            out.append(blank(m.group(0)))
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(text, open_at):
    """The index after the brace that closes the one at `open_at`."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def parse_tree(tree, prefix, out):
    """Flattens a use tree: (path, name) pairs, name None for a glob."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        m = re.fullmatch(r"(.*?)(?:\s+as\s+(\w+))?", tree, re.S)
        path = prefix + [s.strip() for s in m.group(1).split("::") if s.strip()]
        if path and path[-1] == "*":
            out.append((path[:-1], None))
        elif path and path[-1] == "self":
            out.append((path[:-1], m.group(2) or path[-2]))
        elif path:
            out.append((path, m.group(2) or path[-1]))
        return
    head = prefix + [s.strip() for s in tree[:brace].split("::") if s.strip()]
    body = tree[brace + 1 : tree.rfind("}")]
    depth, start = 0, 0
    for j, ch in enumerate(body + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            if body[start:j].strip():
                parse_tree(body[start:j], head, out)
            start = j + 1


class Crate:
    def __init__(self, src):
        self.files = {}  # module path (tuple) -> file name
        self.file_of = {}  # module path (inline ones too) -> file module path
        self.children = {}  # module path -> set of child names
        self.aliases = {}  # module path -> {name: path}
        self.globs = {}  # module path -> [paths]
        self.macros = {}  # exported macro name -> module path
        self.refs = []  # (module, path, file, line, kind) kind: use | pub-use | code
        self.tests = set()  # modules declared `#[cfg(test)] mod name;`
        for root, _, names in os.walk(src):
            for name in sorted(names):
                if name.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(root, name), src)
                    parts = rel[:-3].split(os.sep)
                    if parts[-1] in ("mod", "lib"):
                        parts = parts[:-1]
                    self.files[tuple(parts)] = rel
        for mod, rel in self.files.items():
            if mod:
                self.children.setdefault(mod[:-1], set()).add(mod[-1])
        for mod, rel in sorted(self.files.items()):
            with open(os.path.join(src, rel)) as f:
                self.read(mod, rel, strip(f.read()))

    def read(self, mod, rel, text):
        line = lambda at: text.count("\n", 0, at) + 1
        # Inline modules and #[cfg(test)] items: their spans.
        skip, inline = [], []
        for m in re.finditer(r"#\[cfg\(test\)\]", text):
            k = m.end()
            semi, brace = text.find(";", k), text.find("{", k)
            skip.append((m.start(), matching(text, brace) if 0 <= brace < (semi if semi >= 0 else len(text)) else semi))
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
            inline.append((m.end() - 1, matching(text, m.end() - 1), m.group(1)))
        skipped = lambda at: any(a <= at < b for a, b in skip)

        def scope(at):
            path = mod
            for a, b, name in sorted(inline):
                if a <= at < b:
                    path = path + (name,)
            return path

        self.file_of[mod] = mod
        for a, b, name in inline:
            inner = scope(a) + (name,)
            self.file_of[inner] = mod
            self.children.setdefault(scope(a), set()).add(name)
        for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+(\w+)\s*;", text):
            self.tests.add(scope(m.start()) + (m.group(1),))
        for m in re.finditer(r"#\[macro_export\]\s*macro_rules!\s*(\w+)", text):
            self.macros[m.group(1)] = mod
        used = []
        for m in re.finditer(r"(?:\b(pub)\s*(\([^)]*\))?\s+)?\buse\s+([^;]*);", text):
            used.append((m.start(), m.end()))
            if skipped(m.start()):
                continue
            where, out = scope(m.start()), []
            parse_tree(m.group(3), [], out)
            kind = "pub-use" if m.group(1) else "use"
            for path, name in out:
                if name is None:
                    self.globs.setdefault(where, []).append(path)
                else:
                    self.aliases.setdefault(where, {})[name] = path
                self.refs.append((where, path, rel, line(m.start()), kind))
        in_use = lambda at: any(a <= at < b for a, b in used)
        for m in re.finditer(r"(?<![\w:$])(\w+)((?:\s*::\s*\w+)+)", text):
            if in_use(m.start()) or skipped(m.start()):
                continue
            where = scope(m.start())
            first = m.group(1)
            if first in ("crate", "super", "self") or first in self.children.get(where, ()) or first in self.aliases.get(where, {}):
                path = [first] + [s.strip() for s in m.group(2).split("::") if s.strip()]
                self.refs.append((where, path, rel, line(m.start()), "code"))

    def resolve(self, where, path, seen=()):
        """The module that defines what `path`, written in `where`, names
        (None: outside the crate)."""
        path = list(path)
        if not path:
            return None
        head = path.pop(0)
        if head == "crate":
            mod = ()
        elif head == "self":
            mod = where
        elif head == "super":
            mod = where[:-1]
            while path and path[0] == "super":
                path.pop(0)
                mod = mod[:-1]
        elif head in self.children.get(where, ()):
            mod = where + (head,)
        elif head in self.aliases.get(where, {}) and (where, head) not in seen:
            target = self.aliases[where][head]
            return self.resolve(where, target + path, seen + ((where, head),))
        else:
            return None
        while path:
            s = path.pop(0)
            if s in self.children.get(mod, ()):
                mod = mod + (s,)
            elif s in self.aliases.get(mod, {}) and (mod, s) not in seen:
                return self.resolve(mod, self.aliases[mod][s] + path, seen + ((mod, s),))
            elif mod == () and s in self.macros:
                return self.macros[s]
            else:
                break
        return mod

    def node(self, mod):
        mod = self.file_of.get(mod, mod)
        while mod and mod not in self.files:
            mod = mod[:-1]
        if not mod:
            return None
        return "::".join(mod) if mod[0] in FILE_LEVEL else mod[0]

    def edges(self):
        """{(from, to): [(file, line)]} between nodes."""
        out = {}
        for where, path, rel, line, kind in self.refs:
            if any(where[: len(t)] == t for t in self.tests):
                continue
            target = self.resolve(where, path)
            if target is None:
                continue
            if kind == "pub-use" and target[: len(where)] == where:
                continue  # a facade of its own children
            if where[: len(target)] == target:
                continue  # its own container (a parent module's shared items)
            a, b = self.node(where), self.node(target)
            if a and b and a != b:
                out.setdefault((a, b), []).append(f"{rel}:{line}")
        return out


def circles(nodes, edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for a, b in edges:
            if a == v:
                if b not in index:
                    visit(b)
                    low[v] = min(low[v], low[b])
                elif b in on:
                    low[v] = min(low[v], index[b])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def shortest_circles(comp, edges):
    """The shortest circle through each import inside `comp`, each once."""
    inside = sorted(e for e in edges if e[0] in comp and e[1] in comp)
    found = []
    for a, b in inside:
        back, todo = {b: None}, [b]
        while a not in back:
            v = todo.pop(0)
            for x, y in inside:
                if x == v and y not in back:
                    back[y] = v
                    todo.append(y)
        ring, v = [], back[a]
        while v is not None:
            ring.append(v)
            v = back[v]
        ring = [a] + ring[::-1]
        first = ring.index(min(ring))
        ring = ring[first:] + ring[:first]
        if ring not in found:
            found.append(ring)
    return found


# A file longer than this holds more than one job.
MAX_LINES = 600


def long_files(native):
    """The Rust files under `native` (no build output) over MAX_LINES."""
    found = []
    for root, dirs, files in os.walk(native):
        dirs[:] = [d for d in dirs if d != "target"]
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    n = sum(1 for _ in f)
                if n > MAX_LINES:
                    found.append((os.path.relpath(path), n))
    return sorted(found)


def main():
    args = [a for a in sys.argv[1:] if a != "--edges"]
    crate = Crate(args[0] if args else SRC)
    edges = crate.edges()
    if "--edges" in sys.argv:
        for (a, b), where in sorted(edges.items()):
            print(f"{a} -> {b}  ({', '.join(where)})")
    problems = []
    native = os.path.normpath(os.path.join(SRC if not args else args[0], "..", ".."))
    for path, n in long_files(native):
        problems.append(f"{path} has {n} lines, over {MAX_LINES}: split it by job")
    allowed = {(a, b): why for a, b, why in ALLOWED}
    for a, b in sorted(set(allowed) - set(edges)):
        problems.append(f"allowed import {a} -> {b} no longer exists: remove it from ALLOWED")
    edges = {e: w for e, w in edges.items() if e not in allowed}
    layer = {m: i for i, mods in enumerate(LAYERS) for m in mods}
    top = lambda n: n.split("::")[0]
    for (a, b), where in sorted(edges.items()):
        ta, tb = top(a), top(b)
        if ta == tb:
            continue
        for t in (ta, tb):
            if t not in layer:
                problems.append(f"module {t} is in no layer of LAYERS ({a} -> {b}: {where[0]})")
        if ta in layer and tb in layer and layer[tb] >= layer[ta]:
            rel = "the same layer as" if layer[tb] == layer[ta] else "a higher layer than"
            problems.append(f"{a} imports {b}, of {rel} {ta}: {', '.join(where)}")
    tops = {}
    for (a, b), where in edges.items():
        if top(a) != top(b):
            tops.setdefault((top(a), top(b)), []).extend(where)
    graphs = [("between modules", tops)]
    for mod in FILE_LEVEL:
        graphs.append((f"in {mod}/", {e: w for e, w in edges.items() if top(e[0]) == mod and top(e[1]) == mod}))
    for what, graph in graphs:
        for comp in circles({n for e in graph for n in e}, graph):
            for ring in shortest_circles(comp, graph):
                steps = zip(ring, ring[1:] + ring[:1])
                problems.append(f"circle {what}: " + " -> ".join(f"{a} ({graph[(a, b)][0]})" for a, b in steps) + f" -> {ring[0]}")
    for p in problems:
        print("check-layers: " + p)
    if problems:
        print(f"check-layers: {len(problems)} problem(s); the layers are LAYERS in {os.path.relpath(__file__)}")
        sys.exit(1)
    print(f"check-layers: {len(edges)} imports between modules, no circle, none upward ({len(ALLOWED)} allowed); no Rust file over {MAX_LINES} lines")


if __name__ == "__main__":
    main()
