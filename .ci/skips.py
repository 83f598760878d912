"""pytest's skips by reason, from its short summary (`-ra` / `-rs`: lines
``SKIPPED [N] path[:line]: reason``) on stdin or in the files named, so that a skip that should
not happen on CI is seen.  ``python .ci/skips.py pytest.log`` -> ``skipped 17: 13 llama.cpp's
source tree is not here ...; 4 ...`` (most first), or ``skipped 0``.

``--allowed FILE`` (.ci/allowed_skips.txt: a reason pattern per line, ``*`` any text, then
`` -- `` and why) also fails, exit 1, naming each skip whose reason no pattern matches."""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from fnmatch import fnmatchcase

LINE = re.compile(r"^SKIPPED \[(\d+)\] [^:\s]+(?::\d+)?: (.*)$")


def by_reason(lines) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in lines:
        m = LINE.match(line.rstrip("\n"))
        if m:
            out[m.group(2).strip()] += int(m.group(1))
    return out


def summary(lines) -> str:
    counts = by_reason(lines)
    total = sum(counts.values())
    if not total:
        return "skipped 0"
    return f"skipped {total}: " + "; ".join(f"{n} {reason}" for reason, n in counts.most_common())


def allowed(text: str) -> dict[str, str]:
    """pattern -> why, from the allow-list's lines (blank lines and # comments aside)."""
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        pattern, sep, why = line.partition(" -- ")
        if not sep or not pattern.strip() or not why.strip():
            raise SystemExit(f"allowed skips, line {i}: 'PATTERN -- why' expected, got {line!r}")
        out[pattern.strip()] = why.strip()
    return out


def unlisted(counts: Counter[str], patterns) -> list[tuple[str, int]]:
    """The skips whose reason no pattern matches, most first."""
    return [(r, n) for r, n in counts.most_common() if not any(fnmatchcase(r, p) for p in patterns)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*")
    ap.add_argument("--allowed", help="the allow-list: any other skip reason exits 1")
    a = ap.parse_args(argv)
    lines = [line for f in a.logs for line in open(f, encoding="utf-8", errors="replace")] if a.logs else sys.stdin
    lines = list(lines)
    print(summary(lines))
    if a.allowed is None:
        return 0
    with open(a.allowed, encoding="utf-8") as fh:
        bad = unlisted(by_reason(lines), allowed(fh.read()))
    for reason, n in bad:
        print(f"CI: {n} skipped, a reason {a.allowed} does not list: {reason}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
