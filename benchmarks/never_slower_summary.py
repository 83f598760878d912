"""The figures of benchmarks/never_slower.sh in one JSON and one PNG: per kernel path, the
defaults over plain on Spec-Bench's groups (whole request and tokens per target pass), the code
sets, the README's first command, prompt lookup on a code edit and a prediction on a code edit
and on a whole-file edit; whether every greedy output was plain's.

    python benchmarks/never_slower_summary.py benchmarks/results/zen5/never_slower
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def one_path(d: Path) -> dict:
    sb = json.loads((d / "specbench.json").read_text())
    de = json.loads((d / "defaults.json").read_text())
    pr = json.loads((d / "predicted.json").read_text())
    readme = (d / "readme_run.err").read_text() if (d / "readme_run.err").exists() else ""
    m = re.search(r"speedup ([\d.]+)x over the target alone \([\d.]+ tok/s, (same|different) tokens\)", readme)
    groups = {g: {"speedup": v["speedup"], "tau": v["tau"], "identical": v["identical"]}
              for g, v in sb["summary"]["defaults"].items()}
    code = {s: {"speedup": v["defaults"]["speedup"], "min": v["defaults"]["min_speedup"],
                "identical": v["defaults"]["all_same_ids"]} for s, v in de["summary"].items()}
    pred = {s: {c: {"speedup": v[c]["mean_speedup"], "identical": v[c]["all_same_ids"]}
                for c in ("prompt lookup", "prediction")} for s, v in pr["summary"].items()}
    mach = sb["machine"]
    return {"cpu": f"{mach.get('cpu')} ({mach.get('cpu_microarchitecture')})", "kernels": mach.get("kernel_paths"),
            "pass_costs": sb.get("pass_costs"),
            "specbench": groups, "code_sets": code, "predicted": pred,
            "readme": {"speedup": float(m.group(1)), "identical": m.group(2) == "same"} if m else None}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4))
    labels = list(next(iter(res.values()))["specbench"]) + ["code edit", "fresh code", "readme", "lookup", "prediction"]
    width = 0.8 / len(res)
    for i, (name, r) in enumerate(res.items()):
        vals = [r["specbench"][g]["speedup"] for g in r["specbench"]]
        vals += [r["code_sets"]["code_editing"]["speedup"], r["code_sets"]["fresh_code"]["speedup"],
                 r["readme"]["speedup"] if r["readme"] else 0,
                 r["predicted"]["code_editing"]["prompt lookup"]["speedup"],
                 r["predicted"]["code_editing"]["prediction"]["speedup"]]
        ax.bar([x + i * width for x in range(len(labels))], vals, width, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + width * (len(res) - 1) / 2 for x in range(len(labels))], labels, rotation=30, ha="right")
    ax.set_ylabel("defaults / plain, whole request")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    root = Path(sys.argv[1])
    res = {d.name: one_path(d) for d in sorted(root.iterdir()) if (d / "specbench.json").exists()}
    (root / "summary.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, root / "summary.png")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
