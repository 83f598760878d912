"""docs/architecture.png: the packages, drawn from the code's own imports, and one token's path
from the HTTP request to the kernels and back.

    python docs/map.py            # writes docs/architecture.png (needs matplotlib: the test extra)
    python docs/map.py --check    # exit 1 if the picture is not the one the code draws now

Nothing here is typed by hand but the token's path, and each of its hops is checked against the
imports ("calls": the caller's package imports the callee's; "returns": the reverse; "session":
both import generation, whose Session protocol the engine implements and speculation calls),
so a move that breaks the story breaks this script.  Each package's height is its place in the
import order (one above the highest package it imports); docs/architecture.md's table lists
the modules (a new module changes nothing here).  The PNG carries a digest of what it shows
(a tEXt chunk), which tests/house/test_map.py compares with what the tree gives now, without
drawing.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PNG = ROOT / "docs" / "architecture.png"
KEY = "specdec-map"

# One token of a streamed chat completion: (package, how it is reached from the previous one,
# what happens there).
TOKEN_PATH = [
    ("frontends.serve", "", "1  POST /v1/chat/completions: the request becomes a job; the scheduler steps it"),
    ("api", "calls", "2  Runner: the prompt's ids; drafting and verifying by turns"),
    ("speculation", "calls", "3  a drafter proposes N tokens (q); the target checks them in one pass"),
    ("engine", "session", "4  ModelSession.eval: one forward pass over the N + 1 rows"),
    ("kernels", "calls", "5  matmul, attention, RMSNorm, RoPE"),
    ("engine", "returns", "6  the logits (N + 1, V): p"),
    ("speculation", "session", "7  verify: accept or resample, p against q (generation.sampling)"),
    ("api", "returns", "8  the accepted tokens and the next one"),
    ("frontends.serve", "returns", "9  detokenized, sent as one SSE chunk"),
]


def modules() -> dict[str, Path]:
    """'engine.transformer' -> file, for specdec/ and kernels/ ('kernels.ops')."""
    out = {}
    for base, prefix in ((ROOT / "specdec", ""), (ROOT / "kernels", "kernels.")):
        for f in sorted(base.rglob("*.py")):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = prefix + ".".join(parts) if parts else prefix.rstrip(".")
            if name:
                out[name] = f
    return out


def package_of(module: str, mods: dict[str, Path]) -> str:
    """The package a module lives in ('speculation.drafters.draft_model' -> 'speculation.drafters');
    top-level modules of specdec (errors.py) are their own node."""
    if mods[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0] or module


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `module` imports (relative and absolute, lazy ones too)."""
    is_pkg = path.name == "__init__.py"
    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("specdec."):
                mod = node.module[len("specdec."):]
            else:
                continue
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        elif isinstance(node, ast.Import):
            names = [a.name[len("specdec."):] for a in node.names if a.name.startswith("specdec.")]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != module:
                found.add(n)
    return found


def graph() -> dict:
    """{'packages': [pkg], 'edges': [[a, b], ...] (a imports b), 'level': {pkg: int}, 'path': TOKEN_PATH}."""
    mods = modules()
    known = set(mods)
    pkgs: dict[str, list[str]] = {}
    for m in mods:
        pkgs.setdefault(package_of(m, mods), []).append(m.rpartition(".")[2] if m != package_of(m, mods) else
                                                         "__init__")
    edges = set()
    for m, f in mods.items():
        a = package_of(m, mods)
        for d in imports(m, f, known):
            b = package_of(d, mods)
            if a != b and not a.startswith(b + ".") and not (a == "" or b == ""):
                edges.add((a, b))
    level: dict[str, int] = {}

    def lv(p: str, seen: tuple = ()) -> int:
        if p in seen:
            raise SystemExit(f"map: import cycle through {' -> '.join(seen + (p,))}")
        if p not in level:
            level[p] = 1 + max((lv(b, seen + (p,)) for a, b in edges if a == p), default=-1)
        return level[p]
    for p in pkgs:
        lv(p)
    for i, (pkg, how, _) in enumerate(TOKEN_PATH):
        if pkg not in pkgs:
            raise SystemExit(f"map: the token's path names {pkg}, which is no package now")
        prev = TOKEN_PATH[i - 1][0]
        ok = {"": i == 0, "calls": (prev, pkg) in edges, "returns": (pkg, prev) in edges,
              "session": (prev, "generation") in edges and (pkg, "generation") in edges}[how]
        if not ok:
            raise SystemExit(f"map: step {i + 1} ({prev} {how} {pkg}) is not in the imports: the token's path is stale")
    return {"packages": sorted(pkgs), "edges": sorted(map(list, edges)),
            "level": dict(sorted(level.items())), "path": TOKEN_PATH}


def digest(g: dict) -> str:
    return hashlib.sha256(json.dumps(g, sort_keys=True).encode()).hexdigest()[:16]


def png_digest(path: Path) -> str | None:
    """The digest stored in a PNG's tEXt chunk KEY, or None."""
    data = path.read_bytes()
    i = 8
    while i + 8 <= len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        if kind == b"tEXt" and body.startswith(KEY.encode() + b"\0"):
            return body.split(b"\0", 1)[1].decode()
        if kind == b"zTXt" and body.startswith(KEY.encode() + b"\0"):
            return zlib.decompress(body.split(b"\0", 1)[1][1:]).decode()
        i += 12 + n
    return None


def draw(g: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    rows: dict[int, list[str]] = {}
    for p, lvl in g["level"].items():
        rows.setdefault(lvl, []).append(p)
    width, height = 17.0, 2.1 * (max(rows) + 1) + 1.4
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.2, height)
    ax.axis("off")
    pos = {}
    box_w = 2.9
    for lvl, ps in rows.items():
        ps.sort()
        gap = (width - 6.2) / len(ps)
        for j, p in enumerate(ps):
            x, y = 0.4 + gap * (j + 0.5), 0.6 + 2.1 * lvl
            pos[p] = (x, y)
            label = "specdec." + p if p != "kernels" else "kernels/\n(specdec.kernels)"
            on_path = any(p == q for q, _, _ in g["path"])
            ax.add_patch(FancyBboxPatch((x - box_w / 2, y - 0.5), box_w, 1.0, boxstyle="round,pad=0.03",
                                        fc="#fff3d6" if on_path else "#eef2f7", ec="0.35", lw=1.0))
            ax.text(x, y, label, ha="center", va="center", fontsize=9.5, weight="bold")
    for a, b in g["edges"]:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax.add_patch(FancyArrowPatch((xa, ya - 0.5), (xb, yb + 0.5), arrowstyle="-|>", mutation_scale=7,
                                     color="0.5", lw=0.6, shrinkA=2, shrinkB=2))
    steps = g["path"]
    turn = max(range(len(steps)), key=lambda i: -g["level"][steps[i][0]])     # the lowest: kernels
    for i in range(1, len(steps)):
        (xa, ya), (xb, yb) = pos[steps[i - 1][0]], pos[steps[i][0]]
        down = i <= turn
        off = -0.35 if down else 0.35
        ax.add_patch(FancyArrowPatch((xa + off, ya + (-0.5 if down else 0.5)),
                                     (xb + off, yb + (0.5 if down else -0.5)),
                                     arrowstyle="-|>", mutation_scale=12, lw=2.0,
                                     color="#c0392b" if down else "#2471a3",
                                     connectionstyle="arc3,rad=0.08"))
    tx = width - 5.6
    ax.text(tx, height - 0.5, "One token, from the HTTP request to the kernels and back", fontsize=10, weight="bold")
    for i, (p, _, what) in enumerate(steps):
        ax.text(tx, height - 1.0 - 0.42 * i, f"{what}\n     ({'specdec.' + p if p != 'kernels' else 'kernels/'})",
                fontsize=7.2, va="top", color="#c0392b" if 0 < i <= turn else "#2471a3" if i > turn else "0.1")
    ax.text(tx, 0.9, "grey arrows: package A imports package B\n"
            "height: place in the import order (kernels at the bottom)\n"
            f"drawn by docs/map.py from the imports; digest {digest(g)}", fontsize=7, color="0.35", va="top")
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={KEY: digest(g)})
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare docs/architecture.png with the code")
    ap.add_argument("--out", type=Path, default=PNG)
    a = ap.parse_args(argv)
    g = graph()
    if a.check:
        have = png_digest(a.out) if a.out.exists() else None
        if have != digest(g):
            print(f"{a.out} is stale (it shows {have}, the code draws {digest(g)}): run python docs/map.py",
                  file=sys.stderr)
            return 1
        return 0
    draw(g, a.out)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
