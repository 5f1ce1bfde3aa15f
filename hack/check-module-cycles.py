#!/usr/bin/env python3
"""Report dependency cycles between the modules of each Rust crate in the workspace.

For every crate (a Cargo.toml with a [package] table anywhere under the repository, target/,
_out/ and hidden folders left out) and every crate root in its src/ (lib.rs, main.rs,
bin/*.rs, bin/*/main.rs), the module tree is followed from the root through its `mod`
declarations: `mod a;` is src/a.rs or src/a/mod.rs, `mod b;` inside it src/a/b.rs or
src/a/b/mod.rs (module `a::b`), and an inline `mod b { ... }` is module `a::b` too.

Edges come from the paths written in each module's code:
  - `use` trees (`use crate::a::{b::X, c}`, `use super::*`, `use self::x`, and, at any
    level, `use child::...` relative to the module),
  - paths in code that start with `crate::`, `super::` or `self::`.
A path is resolved to the deepest module it names (`crate::a::b::Item` -> `a::b` when `a::b`
is a module, else `a`), following `use` imports (re-exports such as `pub use a::X` in
lib.rs) when the next segment is one. Left out: comments and doc comments, string and char
literals, every item under `#[cfg(test)]` (`mod tests { ... }`, `mod tests;`, a test-only
`use` or fn), files with `#![cfg(test)]`, and `$crate::` paths in macros (resolved where the
macro expands). Glob imports (`use a::*`) count as an edge to `a` but are not followed for
the names they bring in.

Granularity: a reference from module A to module T becomes an edge between the two children
of their closest common ancestor that contain A and T: `a::b::c -> a::d::e` is `a::b -> a::d`
(both children of `a`); `a::b -> c` is `a -> c` (children of the crate root). References to
an ancestor or a descendant (`use super::Item` from a child, a parent using its child) are no
edge: only siblings can form a cycle. So a cycle is always reported among siblings of one
parent, which is the level at which it can be fixed (move an item to the parent, a child or
a new sibling).

Every strongly connected component with more than one module is reported, per crate root,
with one source location for each edge in it. Exit status: 1 when any crate has a cycle, 0
when none has, 2 on a usage error.

  hack/check-module-cycles.py                 every crate under the repository
  hack/check-module-cycles.py controller      only the crates under controller/
  hack/check-module-cycles.py --self-test     check this script on trees it makes
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

SKIP_DIRS = {"target", "_out", "node_modules", "vendor"}
IDENT = r"(?:r#)?[A-Za-z_][A-Za-z0-9_]*"


# --- source text ---------------------------------------------------------------------------

def strip_code(src):
    """Blank out comments and string/char literals (newlines kept, so offsets map to lines)."""
    out = []
    i, n = 0, len(src)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
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
            out.append(blank(src[i:j]))
            i = j
        elif c in "rb" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")) and \
                re.match(r'(?:br|rb|r)(#*)"', src[i:i + 260]):
            m = re.match(r'(?:br|rb|r)(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(src[i:j]))
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i) and
                          (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(blank(src[i:j]))
            i = j
        elif c == "'":
            # char literal ('x', '\n', '\u{..}') or a lifetime / label ('a), which stays
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 3)
                j = n if j < 0 else j + 1
                out.append(blank(src[i:j]))
                i = j
            elif i + 2 < n and src[i + 2] == "'":
                out.append("   ")
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(text, i):
    """End (exclusive) of the item starting at i: its first `;` or its `{...}` block, at
    bracket depth 0 (so `[u8; 4]` in a signature is not the end)."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == ";":
            return i + 1
        elif depth == 0 and c == "{":
            return block_end(text, i)
        i += 1
    return n


def block_end(text, i):
    """text[i] == '{': the index after its matching '}'."""
    depth, n = 0, len(text)
    while i < n:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTR = re.compile(r"\s*#\s*\[")


def blank_range(text, a, b):
    return text[:a] + "".join("\n" if c == "\n" else " " for c in text[a:b]) + text[b:]


def drop_cfg_test(text):
    """Blank every item (with its other attributes) marked #[cfg(test)]."""
    while True:
        m = CFG_TEST.search(text)
        if not m:
            return text
        j = m.end()
        while True:  # further outer attributes of the same item
            a = ATTR.match(text, j)
            if not a:
                break
            depth, k = 0, a.end() - 1
            while k < len(text):
                if text[k] == "[":
                    depth += 1
                elif text[k] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            j = k + 1
        text = blank_range(text, m.start(), item_end(text, j))


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


# --- module tree ---------------------------------------------------------------------------

class Module:
    def __init__(self, path, file, text, offset_text):
        self.path = path            # tuple of names, () for the crate root
        self.file = file            # the file that holds its code
        self.text = text            # its own code (children's inline blocks blanked)
        self.full = offset_text     # the whole stripped file, for line numbers
        self.uses = []              # (expanded path, position, is_glob)
        self.aliases = {}           # imported name -> absolute path (tuple)
        self.refs = []              # (absolute path tuple, file, line)


MOD_DECL = re.compile(r"(?<![\w:])(?:pub\s*(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")


def load_file(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        src = f.read()
    text = drop_cfg_test(strip_code(src))
    if re.search(r"#\s*!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", text):
        return None
    return text


def build_tree(root_file):
    """All modules reachable from a crate root file: {path tuple: Module}."""
    modules = {}
    problems = []

    def child_file(dir_, name):
        for cand in (os.path.join(dir_, name + ".rs"), os.path.join(dir_, name, "mod.rs")):
            if os.path.isfile(cand):
                return cand
        return None

    def walk(mpath, file, full, start, end, child_dir):
        # the module's own code: [start, end) of its file, its inline children blanked
        own = blank_range(blank_range(full, end, len(full)), 0, start)
        pos = start
        children = []
        while True:
            m = MOD_DECL.search(own, pos, end)
            if not m:
                break
            name = m.group(1).replace("r#", "")
            if m.group(2) == ";":
                children.append((name, None, None))
                pos = m.end()
            else:
                b = block_end(own, m.end() - 1)
                children.append((name, m.end(), b - 1))
                own = blank_range(own, m.start(), b)
                pos = b
        modules[mpath] = Module(mpath, file, own, own)
        for name, s, e in children:
            cpath = mpath + (name,)
            if s is None:
                cf = child_file(child_dir, name)
                if cf is None:
                    problems.append("%s: mod %s; has no file in %s" % (file, name, child_dir))
                    continue
                ctext = load_file(cf)
                if ctext is None:
                    continue
                base = os.path.basename(cf)
                cdir = os.path.dirname(cf) if base == "mod.rs" else os.path.join(os.path.dirname(cf), name)
                walk(cpath, cf, ctext, 0, len(ctext), cdir)
            else:
                walk(cpath, file, full, s, e, os.path.join(child_dir, name))

    text = load_file(root_file)
    if text is not None:
        walk((), root_file, text, 0, len(text), os.path.dirname(root_file))
    return modules, problems


# --- paths ---------------------------------------------------------------------------------

USE_STMT = re.compile(r"(?<![\w:])use\s+([^;]*);")
CODE_PATH = re.compile(r"(?<![\w:$])(crate|super|self)((?:\s*::\s*(?:" + IDENT + r"))+)")
PUB_IN = re.compile(r"pub\s*\(\s*in\s+[^)]*\)")


def expand_use_tree(s):
    """'crate::{a::X, b::{self, Y as Z}}' -> [(['crate','a','X'], 'X', False), ...]."""
    s = re.sub(r"\s+", " ", s).strip()
    out = []

    def parse(prefix, t):
        t = t.strip()
        if not t:
            return
        if t.startswith("::"):
            t = t[2:]
        # split the leading path from a trailing {...}
        brace = t.find("{")
        if brace >= 0 and t.endswith("}"):
            head = t[:brace].rstrip().rstrip(":").rstrip(":").strip()
            segs = prefix + [x.strip() for x in head.split("::") if x.strip()]
            inner = t[brace + 1:-1]
            depth, cur, parts = 0, "", []
            for ch in inner:
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                if ch == "," and depth == 0:
                    parts.append(cur)
                    cur = ""
                else:
                    cur += ch
            parts.append(cur)
            for p in parts:
                p = p.strip()
                if p == "self":
                    out.append((segs, segs[-1] if segs else None, False))
                elif p.startswith("self as "):
                    out.append((segs, p.split(" as ")[1].strip(), False))
                else:
                    parse(segs, p)
            return
        alias = None
        if " as " in t:
            t, alias = [x.strip() for x in t.split(" as ", 1)]
        segs = prefix + [x.strip() for x in t.split("::") if x.strip()]
        if segs and segs[-1] == "*":
            out.append((segs[:-1], None, True))
        elif segs:
            out.append((segs, alias if alias is not None else segs[-1], False))

    parse([], s)
    return out


def anchor(mpath, segs, modules):
    """Absolute path of segs as written in module mpath, or None for an extern path."""
    segs = [x.replace("r#", "") for x in segs]
    if not segs:
        return None
    head = segs[0]
    if head == "crate":
        return tuple(segs[1:])
    if head in ("self", "super"):
        base = list(mpath)
        k = 0
        if head == "self":
            k = 1
        while k < len(segs) and segs[k] == "super":
            if not base:
                return None
            base.pop()
            k += 1
        return tuple(base + segs[k:])
    if mpath + (head,) in modules:  # a child module, uniform path
        return tuple(mpath) + tuple(segs)
    return None


def resolve(path, modules, depth=0):
    """The deepest module that an absolute path names, following imports."""
    best = ()
    for k in range(1, len(path) + 1):
        if path[:k] in modules:
            best = path[:k]
        else:
            break
    rest = path[len(best):]
    if rest and depth < 16:
        alias = modules[best].aliases.get(rest[0]) if best in modules else None
        if alias is not None and alias != path:
            return resolve(alias + tuple(rest[1:]), modules, depth + 1)
    return best


def collect(modules):
    for mod in modules.values():
        text = PUB_IN.sub(lambda m: " " * len(m.group(0)), mod.text)
        for m in USE_STMT.finditer(text):
            line = line_of(mod.full, m.start())
            for segs, name, glob in expand_use_tree(m.group(1)):
                absolute = anchor(mod.path, segs, modules)
                if absolute is None:
                    continue
                if name and not glob and name != "_":
                    mod.aliases[name] = absolute
                mod.uses.append((absolute, line))
        code = USE_STMT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        for m in CODE_PATH.finditer(code):
            segs = [m.group(1)] + [x.strip() for x in m.group(2).split("::") if x.strip()]
            absolute = anchor(mod.path, segs, modules)
            if absolute is not None:
                mod.uses.append((absolute, line_of(mod.full, m.start())))
    # resolve after every module's aliases are known
    for mod in modules.values():
        for absolute, line in mod.uses:
            mod.refs.append((resolve(absolute, modules), mod.file, line))


def sibling_edge(a, t):
    k = 0
    while k < len(a) and k < len(t) and a[k] == t[k]:
        k += 1
    if k == len(a) or k == len(t):
        return None  # t is an ancestor or descendant of a (or a itself)
    return a[:k + 1], t[:k + 1]


def edges_of(modules):
    edges = {}
    for mod in modules.values():
        for target, file, line in mod.refs:
            e = sibling_edge(mod.path, target)
            if e and e not in edges:
                edges[e] = (file, line)
    return edges


def sccs(nodes, edges):
    """Tarjan, iterative; components with more than one node, sorted."""
    adj = {n: [] for n in nodes}
    for (a, b) in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, [])
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(adj):
        if start in index:
            continue
        work = [(start, iter(sorted(adj[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(adj[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return sorted(out)


# --- crates --------------------------------------------------------------------------------

def crate_name(cargo_toml):
    with open(cargo_toml, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^\[package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not m:
        return None
    n = re.search(r'^\s*name\s*=\s*"([^"]+)"', m.group(1), re.M)
    return n.group(1) if n else os.path.basename(os.path.dirname(cargo_toml))


def find_crates(top, only):
    crates = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if "Cargo.toml" in filenames:
            name = crate_name(os.path.join(dirpath, "Cargo.toml"))
            if name and os.path.isdir(os.path.join(dirpath, "src")):
                rel = os.path.relpath(dirpath, top)
                if not only or any(rel == o or rel.startswith(o.rstrip("/") + "/") for o in only):
                    crates.append((name, dirpath))
    return sorted(crates, key=lambda c: c[1])


def crate_roots(crate_dir):
    src = os.path.join(crate_dir, "src")
    roots = []
    for name, kind in (("lib.rs", "lib"), ("main.rs", "bin")):
        if os.path.isfile(os.path.join(src, name)):
            roots.append((kind, os.path.join(src, name)))
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for e in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, e)
            if e.endswith(".rs") and os.path.isfile(p):
                roots.append(("bin " + e[:-3], p))
            elif os.path.isfile(os.path.join(p, "main.rs")):
                roots.append(("bin " + e, os.path.join(p, "main.rs")))
    return roots


def fmt(path):
    return "::".join(path) if path else "crate"


def check(top, only=(), out=sys.stdout):
    """Print the report; return the number of cycles found."""
    total = 0
    crates = find_crates(top, only)
    if not crates:
        print("no crates found under %s" % top, file=out)
    for name, cdir in crates:
        for kind, root in crate_roots(cdir):
            modules, problems = build_tree(root)
            collect(modules)
            edges = edges_of(modules)
            comps = sccs(list(modules), edges)
            rel = os.path.relpath(root, top)
            for p in problems:
                print("%s (%s): warning: %s" % (name, kind, os.path.relpath(p, top) if os.path.exists(p) else p), file=out)
            if not comps:
                print("%s (%s, %s): %d modules, no cycle" % (name, kind, rel, len(modules)), file=out)
                continue
            total += len(comps)
            print("%s (%s, %s): %d modules, %d cycle%s" % (
                name, kind, rel, len(modules), len(comps), "" if len(comps) == 1 else "s"), file=out)
            for comp in comps:
                members = set(comp)
                sep = " <-> " if len(comp) == 2 else ", "
                print("  cycle: %s" % sep.join(fmt(c) for c in comp), file=out)
                for (a, b), (file, line) in sorted(edges.items()):
                    if a in members and b in members:
                        print("    %s -> %s   (%s:%d)" % (fmt(a), fmt(b), os.path.relpath(file, top), line), file=out)
    return total


# --- self-test -----------------------------------------------------------------------------

def write_tree(top, files):
    for rel, text in files.items():
        p = os.path.join(top, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)


SELF_TEST_CYCLIC = {
    "cyc/Cargo.toml": '[package]\nname = "cyc"\nversion = "0.1.0"\n',
    "cyc/src/lib.rs": "//! crate::c in a doc comment is no edge\nmod a;\nmod b;\nmod c;\npub mod n;\n"
                      "pub use a::Thing;\n",
    # a -> b through a use tree
    "cyc/src/a.rs": "use crate::{b::{self, Other}, c};\npub struct Thing;\n"
                    "fn f() -> b::Other { Other }\n",
    # b -> a through a re-export at the root (crate::Thing is a::Thing)
    "cyc/src/b.rs": "pub struct Other;\nfn g(_: crate::Thing) {}\n",
    # c mentions b only where it does not count: comments, strings, test code
    "cyc/src/c.rs": "// use crate::b;\n/* crate::b::Other /* nested */ crate::b */\n"
                    "const S: &str = \"crate::b \\\" crate::b\";\n"
                    "const R: &str = r#\"crate::b\"#;\nfn h<'a>(x: &'a str) -> char { 'c' }\n"
                    "#[cfg(test)]\nmod tests {\n    use crate::b::Other;\n}\n"
                    "#[cfg(test)]\nuse crate::b::Other;\n",
    # nested: n::p <-> n::q through super::, and n::p -> a (not a cycle: a does not use n)
    "cyc/src/n/mod.rs": "mod p;\nmod q;\n",
    "cyc/src/n/p.rs": "use super::q::Q;\npub struct P;\nfn f(_: crate::a::Thing) {}\n",
    "cyc/src/n/q.rs": "pub struct Q;\nfn f(_: super::p::P) {}\n",
}

SELF_TEST_ACYCLIC = {
    "ok/Cargo.toml": '[package]\nname = "ok"\nversion = "0.1.0"\n',
    "ok/src/lib.rs": "mod a;\nmod b;\nmod c { pub fn f() { super::a::g() } }\n",
    "ok/src/a.rs": "use crate::b::B;\npub fn g() {}\nfn h(_: B) {}\n"
                   "#[cfg(test)]\nmod tests;\n",
    "ok/src/a/tests.rs": "use crate::c::f;\n",  # test-only file: not followed
    "ok/src/b.rs": "pub struct B;\n/// see [`crate::a::g`]\nfn k() {}\n",
    "ok/src/main.rs": "mod cli;\nfn main() { cli::run() }\n",
    "ok/src/cli.rs": "pub fn run() { let _ = crate::main; }\n",
}


def edge_names(root_file):
    modules, _ = build_tree(root_file)
    collect(modules)
    return {(fmt(a), fmt(b)) for (a, b) in edges_of(modules)}


def self_test():
    failures, checks = [], [0]

    def expect(what, cond):
        checks[0] += 1
        if not cond:
            failures.append(what)
        print("  %s: %s" % ("ok  " if cond else "FAIL", what))

    with tempfile.TemporaryDirectory() as d:
        write_tree(d, SELF_TEST_CYCLIC)
        write_tree(d, SELF_TEST_ACYCLIC)
        import io
        buf = io.StringIO()
        n = check(d, ["cyc"], buf)
        report = buf.getvalue()
        print(report, end="")
        expect("cyclic crate: 2 cycles", n == 2)
        expect("a <-> b (use tree, re-export at the root)", "cycle: a <-> b\n" in report)
        expect("n::p <-> n::q (super::)", "cycle: n::p <-> n::q\n" in report)
        got = edge_names(os.path.join(d, "cyc/src/lib.rs"))
        want = {("a", "b"), ("a", "c"), ("b", "a"), ("n", "a"), ("n::p", "n::q"), ("n::q", "n::p")}
        expect("cyclic crate: exactly the edges written in code (none from comments, strings, "
               "#[cfg(test)] items; none to an ancestor)", got == want)
        if got != want:
            print("    got %s" % sorted(got))
        buf = io.StringIO()
        n = check(d, ["ok"], buf)
        print(buf.getvalue(), end="")
        expect("acyclic crate: no cycle (lib and bin)", n == 0 and buf.getvalue().count("no cycle") == 2)
        got = edge_names(os.path.join(d, "ok/src/lib.rs"))
        expect("acyclic crate: inline module's super:: is an edge, a #[cfg(test)] file is not followed",
               got == {("a", "b"), ("c", "a")})
        if got != {("a", "b"), ("c", "a")}:
            print("    got %s" % sorted(got))
        # the command's exit status, as make sees it
        me = os.path.abspath(__file__)
        rc1 = subprocess.run([sys.executable, me, "--root", d, "cyc"], stdout=subprocess.DEVNULL).returncode
        rc0 = subprocess.run([sys.executable, me, "--root", d, "ok"], stdout=subprocess.DEVNULL).returncode
        expect("exit 1 with a cycle", rc1 == 1)
        expect("exit 0 without", rc0 == 0)
    print("self-test: %d passed, %d failed" % (checks[0] - len(failures), len(failures)))
    return 1 if failures else 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("crates", nargs="*", metavar="DIR",
                    help="only the crates in or under these folders (relative to --root)")
    ap.add_argument("--root", default=os.path.dirname(here),
                    help="the repository to scan (default: the one holding this script)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the script itself on a tree with cycles and one without")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    n = check(args.root, args.crates)
    if n:
        print("module cycles: %d" % n)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
