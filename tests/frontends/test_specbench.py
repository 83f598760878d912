"""benchmarks/specbench.py, a one-question-per-group smoke run on tiny models: every group and
method is reported, specdec's outputs equal plain's, the JSON and the plot are written.  (The
benchmark itself is a script, not a test: docs/speculative.md, "Spec-Bench on the CPU".)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synth import TinySpec, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def test_smoke_run(tmp_path):
    target = write_tiny_model(tmp_path / "t.gguf", TinySpec(seed=1, logit_scale=4.0))
    draft = write_tiny_model(tmp_path / "d.gguf", TinySpec(seed=2, logit_scale=4.0))
    qs = [{"question_id": 1, "category": "writing", "turns": ["abc abc", "cab"]}]
    qs += [{"question_id": 10 + i, "category": g, "turns": ["ab ca ab ca " * 3]}
           for i, g in enumerate(GROUPS[1:])]
    qfile = tmp_path / "question.jsonl"
    qfile.write_text("\n".join(json.dumps(q) for q in qs) + "\n")
    methods = "plain,model,prompt-lookup,suffix,hybrid,defaults,tree"
    r = subprocess.run([sys.executable, "benchmarks/specbench.py", "--questions", str(qfile),
                        "--per-category", "1", "--max-tokens", "6", "--methods", methods,
                        "--target", str(target), "--draft", str(draft), "--out", str(tmp_path / "out")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "out" / "specbench.json").read_text())
    assert set(res["summary"]) == set(methods.split(","))
    for m, per in res["summary"].items():
        assert set(per) == {*GROUPS, "overall"}, m
        assert per["overall"]["identical"] is True, m
    assert len(res["rows"]["plain"]) == 7                   # MT-bench's two turns + 5 groups
    assert (tmp_path / "out" / "specbench.png").stat().st_size > 0
