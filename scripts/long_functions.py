#!/usr/bin/env python3
"""List production Rust functions longer than N lines (default 150).

Usage: scripts/long_functions.py [--min N] [PATH...]   (default PATH: crates)
Skips tests/, benches/, examples/, files named tests.rs, files declared under
#[cfg(test)], and #[cfg(test)] mod blocks. Length = lines from the `fn` line to its
closing brace, inclusive.
"""
import os, re, sys

def strip(src):
    """Replace comments, strings and char literals with spaces (keeping newlines)."""
    out = []; i = 0; n = len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif src.startswith('/*', i):
            depth = 0; j = i
            while j < n:
                if src.startswith('/*', j): depth += 1; j += 2
                elif src.startswith('*/', j):
                    depth -= 1; j += 2
                    if depth == 0: break
                else: j += 1
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == 'r' and re.match(r'r#*"', src[i:i+10]) and not (i and (src[i-1].isalnum() or src[i-1] == '_')):
            m = re.match(r'r(#*)"', src[i:]); hashes = m.group(1)
            end = src.find('"' + hashes, i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            j += 1
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:i+12])
            if m:
                out.append(' ' * len(m.group(0))); i += len(m.group(0))
            else:
                out.append(c); i += 1
        else:
            out.append(c); i += 1
    return ''.join(out)

def block_end(s, open_idx):
    depth = 0
    for j in range(open_idx, len(s)):
        if s[j] == '{': depth += 1
        elif s[j] == '}':
            depth -= 1
            if depth == 0: return j
    return len(s) - 1

def test_files(root):
    """Files declared as `#[cfg(test)] mod x;`."""
    skip = set()
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            s = open(p, encoding='utf-8').read()
            for m in re.finditer(r'#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', s):
                base = dp if f in ('mod.rs', 'lib.rs', 'main.rs') else os.path.join(dp, f[:-3])
                skip.add(os.path.join(base, m.group(1) + '.rs'))
                skip.add(os.path.join(base, m.group(1), 'mod.rs'))
    return skip

def scan(path, min_len, skip):
    s = strip(open(path, encoding='utf-8').read())
    dead = []  # ranges of #[cfg(test)] mod blocks
    for m in re.finditer(r'#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{', s):
        o = m.end() - 1; dead.append((m.start(), block_end(s, o)))
    res = []
    for m in re.finditer(r'\bfn\s+(\w+)', s):
        if any(a <= m.start() <= b for a, b in dead): continue
        # find the body's `{` or a `;` (trait method without body), skipping generics/where
        j = m.end(); depth = 0
        while j < len(s):
            ch = s[j]
            if ch in '(<[': depth += 1
            elif ch in ')>]': depth -= 1 if not (ch == '>' and s[j-1] == '-') else 0
            elif ch == ';' and depth <= 0: j = -1; break
            elif ch == '{' and depth <= 0: break
            j += 1
        if j < 0 or j >= len(s): continue
        e = block_end(s, j)
        a = s.count('\n', 0, m.start()) + 1; b = s.count('\n', 0, e) + 1
        if b - a + 1 > min_len: res.append((b - a + 1, path, a, m.group(1)))
    return res

def main():
    args = sys.argv[1:]; min_len = 150
    if args[:1] == ['--min']: min_len = int(args[1]); args = args[2:]
    roots = args or ['crates']
    out = []
    for root in roots:
        skip = test_files(root) if os.path.isdir(root) else set()
        walk = os.walk(root) if os.path.isdir(root) else [(os.path.dirname(root), [], [os.path.basename(root)])]
        for dp, dns, fs in walk:
            dns[:] = [d for d in dns if d not in ('tests', 'benches', 'examples', 'target', 'fuzz')]
            for f in fs:
                p = os.path.join(dp, f)
                if not f.endswith('.rs') or f == 'tests.rs' or p in skip: continue
                out += scan(p, min_len, skip)
    for n, p, a, name in sorted(out, reverse=True):
        print(f'{n:5d}  {p}:{a}  {name}')

main()
