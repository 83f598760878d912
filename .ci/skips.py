"""One line: pytest's skips by reason, from its short summary (`-ra` / `-rs`: lines
``SKIPPED [N] path[:line]: reason``) on stdin or in the files named, so that a skip that should
not happen on CI is seen.  ``python .ci/skips.py pytest.log`` -> ``skipped 17: 13 llama.cpp's
source tree is not here ...; 4 ...`` (most first), or ``skipped 0``."""
from __future__ import annotations

import re
import sys
from collections import Counter

LINE = re.compile(r"^SKIPPED \[(\d+)\] [^:\s]+(?::\d+)?: (.*)$")


def summary(lines) -> str:
    by_reason: Counter[str] = Counter()
    for line in lines:
        m = LINE.match(line.rstrip("\n"))
        if m:
            by_reason[m.group(2).strip()] += int(m.group(1))
    total = sum(by_reason.values())
    if not total:
        return "skipped 0"
    return f"skipped {total}: " + "; ".join(f"{n} {reason}" for reason, n in by_reason.most_common())


if __name__ == "__main__":
    files = sys.argv[1:]
    lines = [line for f in files for line in open(f, encoding="utf-8", errors="replace")] if files else sys.stdin
    print(summary(lines))
