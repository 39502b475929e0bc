#!/usr/bin/env python3
"""Counts the shape figures the aesthetics reviews track, for a tree of Rust crates.

    scripts/code-counts.py [ROOT] [--list] [--crates]

Prints three figures for ROOT/crates (default: the repository):

* files over 800 lines (every `.rs` file, tests included, as the review counts them);
* non-test functions over 100 and over 150 lines (a brace-matching counter; it skips
  `tests/`, `examples/`, `benches/`, `fuzz/`, `#[cfg(test)]` modules, `#[test]` functions
  and `proptest!` blocks);
* the short-name ratio: `let`, `if let` and `while let` bindings of one or two characters
  among all such bindings, outside test code.

`--list` also prints the long files and functions; `--crates` a line per crate: its
non-test code lines (lines with code once comments and literals are blanked), its
functions over 100 lines and its short-name ratio. The counters read text, not a syntax
tree: comments, strings and char literals are blanked first so that braces inside them do
not count, which is enough for rustfmt-formatted code.
"""

import os
import re
import sys

SKIP_DIRS = {"tests", "examples", "benches", "fuzz", "target"}
KEYWORDS = {"mut", "ref", "box", "_", "in", "if", "let", "else", "true", "false"}


def blank_literals(text):
    """Replaces comments, string and char literals by spaces, keeping newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
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
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
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


def match_brace(text, open_at):
    """Index just past the brace that closes the one at `open_at`."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def strip_tests(text):
    """Blanks `#[cfg(test)]` items, `#[test]` functions and `proptest!` blocks."""
    spans = []
    for m in re.finditer(r"#\[cfg\(test\)\]|#\[test\]|proptest!\s*\{", text):
        start = m.start()
        brace = text.find("{", m.start() if m.group(0).startswith("proptest") else m.end())
        semi = text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace and not m.group(0).startswith("proptest")):
            continue  # `#[cfg(test)] use …;` or `mod tests;`
        spans.append((start, match_brace(text, brace)))
    chars = list(text)
    for start, end in spans:
        for k in range(start, end):
            if chars[k] != "\n":
                chars[k] = " "
    return "".join(chars)


def body_start(text, at):
    """The `{` that opens the body of the signature starting at `at`, or None at a `;`.

    Brackets are tracked so that `[u8; 6]` in a signature does not end it."""
    depth = 0
    for j in range(at, len(text)):
        ch = text[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch == ";":
            return None
        elif depth == 0 and ch == "{":
            return j
    return None


def functions(text):
    """(name, first line, line count) of every function with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", text):
        brace = body_start(text, m.end())
        if brace is None:
            continue  # a declaration without a body
        end = match_brace(text, brace)
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, end - 1) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def split_top(s, sep):
    """Splits `s` at `sep` characters that are outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def pattern_bindings(pattern):
    """The names a `let` pattern binds (lowercase identifiers that are not paths or fields)."""
    names = []
    for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", pattern):
        word = m.group(0)
        if word in KEYWORDS or not (word[0].islower() or word[0] == "_"):
            continue
        before = pattern[: m.start()].rstrip()
        after = pattern[m.end():].lstrip()
        if before.endswith("::") or after.startswith("::") or after.startswith("("):
            continue
        if after.startswith(":") and not after.startswith("::"):
            continue  # a field name in `Struct { field: binding }`
        if after.startswith("!"):
            continue  # a macro
        names.append(word)
    return names


def let_names(text):
    names = []
    for m in re.finditer(r"\blet\s+", text):
        rest = text[m.end(): m.end() + 400]
        # The pattern ends at `=` (not `==`, `=>`) or `;` outside brackets.
        depth, end = 0, None
        for k, ch in enumerate(rest):
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif depth == 0 and ch == ";":
                end = k
                break
            elif depth == 0 and ch == "=" and rest[k + 1: k + 2] not in ("=", ">") and rest[k - 1: k] not in ("=", "!", "<", ">"):
                end = k
                break
        if end is None:
            continue
        pattern = split_top(rest[:end], ":")[0]
        names.extend(pattern_bindings(pattern))
    return names


def rust_files(root):
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "target" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".rs"):
                yield os.path.join(base, name)


def is_test_path(path, root):
    parts = os.path.relpath(path, root).split(os.sep)
    return any(p in SKIP_DIRS for p in parts[:-1])


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    listing = "--list" in sys.argv
    per_crate = "--crates" in sys.argv
    crate_figures = {}
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    crates = os.path.join(root, "crates")
    long_files, long_fns, names = [], [], []
    for path in rust_files(crates):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        rel = os.path.relpath(path, root)
        lines = raw.count("\n")
        if lines > 800:
            long_files.append((lines, rel))
        if is_test_path(path, crates):
            continue
        code = strip_tests(blank_literals(raw))
        file_long = [(count, f"{rel}:{line} {name}") for name, line, count in functions(code) if count > 100]
        file_names = let_names(code)
        long_fns.extend(file_long)
        names.extend(file_names)
        crate = os.path.relpath(path, crates).split(os.sep)[0]
        figures = crate_figures.setdefault(crate, [0, 0, 0, 0])
        figures[0] += sum(1 for line in code.split("\n") if line.strip())
        figures[1] += len(file_long)
        figures[2] += sum(1 for n in file_names if len(n.lstrip("_") or n) <= 2)
        figures[3] += len(file_names)
    short = sum(1 for n in names if len(n.lstrip("_") or n) <= 2)
    over150 = sum(1 for count, _ in long_fns if count > 150)
    print(f"files over 800 lines: {len(long_files)}")
    print(f"non-test functions over 100 lines: {len(long_fns)} (over 150: {over150})")
    ratio = 100.0 * short / max(1, len(names))
    print(f"short let names (<= 2 chars): {short} / {len(names)} = {ratio:.0f}%")
    if per_crate:
        for crate, (code_lines, long_count, short_count, name_count) in sorted(crate_figures.items()):
            share = 100.0 * short_count / max(1, name_count)
            print(f"  crate {crate:16} {code_lines:6} code lines, {long_count:2} fns > 100, short names {share:3.0f}%")
    if listing:
        for lines, rel in sorted(long_files, reverse=True):
            print(f"  file {lines:5} {rel}")
        for count, where in sorted(long_fns, reverse=True):
            print(f"  fn   {count:5} {where}")


if __name__ == "__main__":
    main()
