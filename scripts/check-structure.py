#!/usr/bin/env python3
"""Keeps the Rust code's shape (issue 32): no circle of modules within a crate, and no
function longer than a reader can hold in mind.

    scripts/check-structure.py [--list] [RUST_DIR]

Fails (exit 1) when sibling modules of a crate under RUST_DIR (default: rust/ beside this
script) use each other in a circle: its top-level modules, or the modules of one directory
(kfd-emu's device/aql.rs, device/sdma.rs, ...; a module and what is below it count as one).
Uses are `crate::` and `super::` paths and names a parent module imports from a child
(`use state::State;` in device/mod.rs makes `super::State` a use of state), in product
code (test modules and files are left out: a test may reach anywhere); the circles found
when the check went below the top level are listed in KNOWN_CIRCLES. It also fails when
a function outside the allow-list below is longer than MAX_LINES. --list prints every
function over the bound, allowed or not, longest first, and the known circles.

The scan is lexical: comments, strings and char literals are blanked, then braces are
matched. It does not expand macros, so a function a macro writes is not seen.
"""

import os
import re
import sys

# A function body a reader can hold in mind: about one screen.
MAX_LINES = 80

# Functions over the bound, each with why it is still long; issue 32 tracks them all. An
# entry that no longer matches a long function is reported as stale, so the list only
# shrinks; a new long function fails the check.
NOT_YET = "issue 32, not yet split"
ALLOWED = {
}


# Circles of sibling modules found when the check went below the top level, each with
# why it stays for now; the modules of one must stay exactly these (a circle that grows,
# shrinks or appears fails the check), so that each can only be broken, not extended.
CIRCLES_NOT_YET = "issue 32, not yet broken"
KNOWN_CIRCLES = {
}

def blank(src):
    """src with comments, string and char literals replaced by spaces (newlines kept)."""
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
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', src[i:i + 300])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = src.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', b'x'), else a lifetime or label.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:i + 12])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def functions(text):
    """(name, first line, line count) of every function with a body in blanked text."""
    for m in FN.finditer(text):
        depth = 0
        for j in range(m.end(), len(text)):
            c = text[j]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif depth == 0 and c == ";":
                break  # a declaration without a body
            elif depth == 0 and c == "{":
                end = matching_brace(text, j)
                first = text.count("\n", 0, m.start()) + 1
                last = text.count("\n", 0, end) + 1
                yield m.group(1), first, last - first + 1
                break


TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def without_tests(text):
    """Blanked text with inline `#[cfg(test)] mod x { ... }` bodies removed."""
    while m := TEST_MOD.search(text):
        end = matching_brace(text, m.end() - 1)
        text = text[:m.start()] + re.sub(r"[^\n]", " ", text[m.start():end + 1]) + text[end + 1:]
    return text


def rust_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("target", "fuzz"))
        for f in sorted(filenames):
            if f.endswith(".rs"):
                yield os.path.join(dirpath, f)


def crates(rust_dir):
    for name in sorted(os.listdir(rust_dir)):
        src = os.path.join(rust_dir, name, "src")
        if os.path.isfile(os.path.join(rust_dir, name, "Cargo.toml")) and os.path.isdir(src):
            yield name, src


def module_path(src_dir, path):
    """The module path of a file under src/: src/a/b.rs -> [a, b], src/a/mod.rs -> [a]."""
    parts = os.path.relpath(path, src_dir)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts.pop()
    if parts and parts[0] == "bin":
        return None  # a binary of its own: its own crate root
    if parts in (["lib"], ["main"]):
        return []
    return parts


def is_test_file(rel):
    return rel.endswith("/tests.rs") or "/tests/" in rel


PATH = re.compile(r"\b(crate|super)((?:\s*::\s*super)*)\s*::\s*(\{|[A-Za-z_][A-Za-z0-9_]*)")


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+(?:self\s*::\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*::([^;]*);")


def imported_names(parent_text, children, public_only):
    """Name -> child module, for the items a module file imports from its child modules
    (`pub use session::{DumpSession, ...}` in lib.rs, `use state::State;` in
    device/mod.rs): a path naming the parent's `DumpSession` is a use of session.
    public_only: only `pub use` (a crate root's, which its modules see as `crate::X`)."""
    names = {}
    for m in USE.finditer(parent_text):
        if m.group(2) in children and (m.group(1) or not public_only):
            for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?=[,}]|$)", m.group(3)):
                names[name] = m.group(2)
            for alias in re.findall(r"\bas\s+([A-Za-z_][A-Za-z0-9_]*)", m.group(3)):
                names[alias] = m.group(2)
    return names


def split_group(group):
    """The top-level entries of a `{a::b, c::{d, e}}` group's inside."""
    depth, names, cur = 0, [], ""
    for c in group:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            names.append(cur)
            cur = ""
            continue
        cur += c
    names.append(cur)
    return names


def expand(tail):
    """The paths (lists of names) a `a::b::{c, d::e}` path tail names."""
    tail = tail.strip()
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*(::\s*)?", tail)
    if tail.startswith("{"):
        close = matching_brace(tail, 0)
        return [p for part in split_group(tail[1:close]) for p in expand(part)]
    if not m:
        return [[]]
    if not m.group(2):
        return [[m.group(1)]]
    return [[m.group(1)] + rest for rest in expand(tail[m.end():])]


def used_paths(text, mod_path):
    """The absolute module paths a file at mod_path names through crate:: or super::
    paths (as far as the path goes: `crate::a::b::Item` gives [a, b, Item])."""
    used = []
    for m in PATH.finditer(text):
        if m.group(1) == "crate":
            base = []
        else:
            up = 1 + m.group(2).count("super")
            if up > len(mod_path):
                continue
            base = mod_path[:len(mod_path) - up]
        if m.group(3) == "{":
            close = matching_brace(text, m.end() - 1)
            tails = expand(text[m.end() - 1:close + 1])
        else:
            rest = re.match(r"(\s*::\s*(?:[A-Za-z_][A-Za-z0-9_]*|\{))*", text[m.end():]).group(0)
            tail = m.group(3) + rest
            if tail.endswith("{"):
                close = matching_brace(text, m.end() + len(rest) - 1)
                tail += text[m.end() + len(rest):close + 1]
            tails = expand(tail)
        used.extend(base + t for t in tails if t)
    return used


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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


def self_test():
    """The checks see what they must: a circle through a grouped `use`, a re-export and
    `super::super::`, one of sibling modules through a nested group and a parent's
    import, and a long function despite braces in strings and comments."""
    import tempfile
    files = {
        "Cargo.toml": "",
        "src/lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\npub use a::Thing;\n",
        "src/a.rs": "use crate::{b::X, std_like};\n#[cfg(test)]\nmod tests { use crate::d::Y; }\n",
        "src/d.rs": "use crate::a;\n",
        "src/b/mod.rs": "mod inner;\nmod other;\nmod third;\nuse inner::Q;\n",
        "src/b/inner.rs": "fn f() { let _ = super::super::c::Z; let _ = crate::b::{third, other::R}; }\n",
        "src/b/other.rs": "use super::Q;\n",
        "src/b/third.rs": "",
        "src/c.rs": "fn g() -> u32 { crate::Thing }\n"
        + "fn long() {\n    let s = \"}\"; // }\n    let c = '}';\n" + "    ();\n" * 80 + "}\n",
    }
    with tempfile.TemporaryDirectory() as d:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, "k", rel)), exist_ok=True)
            with open(os.path.join(d, "k", rel), "w", encoding="utf-8") as fh:
                fh.write(text)
        circles_found, long_found = scan(d)
    want = ([("k", "", ["a", "b", "c"]), ("k", "b", ["inner", "other"])], [("k/src/c.rs", "long")])
    got = ([(c, p, comp) for c, p, comp, _ in circles_found], [(r, n) for _, r, _, n in long_found])
    if got != want:
        sys.exit(f"check-structure: self-test failed: found {got}, expected {want}")


def scan(rust_dir):
    """The circles ((crate, parent module path, modules, edges)) and the long functions
    ((lines, file, line, name)) of the crates under rust_dir."""
    found_circles, long_fns = [], []

    for crate, src in crates(rust_dir):
        files = list(rust_files(src))
        paths = {tuple(module_path(src, f)): f for f in files if module_path(src, f) is not None}
        # Parent module path -> its child modules (from the files).
        children = {}
        for mp in paths:
            for k in range(len(mp)):
                children.setdefault(mp[:k], set()).add(mp[k])
        imports = {}
        for parent, kids in children.items():
            if parent in paths:
                with open(paths[parent], encoding="utf-8") as fh:
                    text = without_tests(blank(fh.read()))
                imports[parent] = imported_names(text, kids, public_only=parent == ())
        # Parent module path -> graph and why of its children.
        graphs = {}
        for f in files:
            with open(f, encoding="utf-8") as fh:
                text = blank(fh.read())
            rel = os.path.relpath(f, rust_dir)
            for name, line, count in functions(text):
                if count > MAX_LINES:
                    long_fns.append((count, rel, line, name))
            mp = module_path(src, f)
            if not mp or is_test_file(os.path.relpath(f, src)):
                continue
            for used in used_paths(without_tests(text), mp):
                for k in range(len(mp)):
                    parent = tuple(mp[:k])
                    if tuple(used[:k]) != parent:
                        break
                    if len(used) > k and used[k] in children[parent]:
                        target = used[k]
                    elif len(used) == k + 1 and used[k] in imports.get(parent, {}):
                        target = imports[parent][used[k]]
                    else:
                        continue
                    if target != mp[k]:
                        graph, why = graphs.setdefault(parent, ({}, {}))
                        graph.setdefault(mp[k], set()).add(target)
                        why.setdefault((mp[k], target), rel)
        for parent in sorted(graphs):
            graph, why = graphs[parent]
            for comp in circles(graph):
                edges = [f"{a} -> {b} ({why[(a, b)]})" for a in comp for b in sorted(graph[a]) if b in comp]
                found_circles.append((crate, "::".join(parent), comp, edges))
    return found_circles, long_fns


def main(argv):
    list_all = "--list" in argv
    args = [a for a in argv if not a.startswith("--")]
    rust_dir = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rust")
    self_test()
    found_circles, long_fns = scan(os.path.normpath(rust_dir))
    failed, seen_allowed = False, set()
    seen_circles = set()
    for crate, parent, comp, edges in found_circles:
        where = f"modules of {parent}" if parent else "top-level modules"
        known = KNOWN_CIRCLES.get((crate, parent, tuple(comp)))
        if known:
            seen_circles.add((crate, parent, tuple(comp)))
            if list_all:
                print(f"check-structure: {crate}: {where} in a circle: {', '.join(comp)} ({known})")
            continue
        failed = True
        print(f"check-structure: {crate}: {where} in a circle: {', '.join(comp)}")
        for e in edges:
            print(f"  {e}")
    for crate, parent, comp in sorted(set(KNOWN_CIRCLES) - seen_circles):
        failed = True
        print(f"check-structure: {crate}: the circle of {parent}'s {', '.join(comp)} is known but "
              "is not there as it is: remove it from KNOWN_CIRCLES (or break the new one)")
    for count, rel, line, name in sorted(long_fns, reverse=True):
        allowed = ALLOWED.get((rel, name))
        if allowed:
            seen_allowed.add((rel, name))
        if not allowed:
            failed = True
            print(f"check-structure: {rel}:{line}: fn {name} is {count} lines (bound {MAX_LINES}): split it into named steps")
        elif list_all:
            print(f"check-structure: {rel}:{line}: fn {name} is {count} lines ({allowed})")
    for rel, name in sorted(set(ALLOWED) - seen_allowed):
        failed = True
        print(f"check-structure: {rel}: fn {name} is allowed to be long but is not: remove it from ALLOWED")
    if not failed:
        print(f"check-structure: no circle of modules but {len(KNOWN_CIRCLES)} known; "
              f"{len(long_fns)} function(s) "
              f"over {MAX_LINES} lines, all allowed (--list names them)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
