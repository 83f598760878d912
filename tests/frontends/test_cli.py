"""The CLI as a user meets it: `specdec ...` in a subprocess, on tiny synthetic models.

Exit codes (0 ok, 2 bad input with one line on stderr and no traceback), help texts, streaming
order (generated text before the summary), colours, traces and their report, chat over a pipe.
Bad flags and bad files are covered in engine/test_bad_input.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from helpers import cli, one_line_error
from synth import TinySpec, write_tiny_model

TEMPLATE = ("{% for m in messages %}{{ m['role'][0] | upper }}{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}A{% endif %}")
SUMMARY = re.compile(r"^specdec: \d+ tokens in [\d.]+ s = [\d.]+ tok/s; ", re.M)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    return {
        "target": str(write_tiny_model(d / "target.gguf", TinySpec(n_vocab=52, chat_template=TEMPLATE))),
        "draft": str(write_tiny_model(d / "draft.gguf", TinySpec(n_vocab=52, seed=1, d_model=32, n_layer=1))),
        "other": str(write_tiny_model(d / "other.gguf", TinySpec(n_vocab=300, seed=2))),
        "dir": d,
    }


def test_help_reads_like_llama_cli():
    top = cli("--help")
    assert top.returncode == 0
    for cmd in ("run", "chat", "info", "pull", "models", "trace-report", "bench"):
        assert cmd in top.stdout
    run = cli("run", "--help")
    assert run.returncode == 0
    for flag in ("-m, --model FNAME", "-md, --draft-model", "--draft-n", "--draft-p", "-p, --prompt",
                 "-f, --file FNAME", "-n, --n-predict N", "-c, --ctx-size N", "-t, --threads N",
                 "-s, --seed SEED", "--temp N", "--top-k N", "--top-p N", "--min-p N", "--ignore-eos",
                 "-sys, --system-prompt", "-cnv, --conversation", "--no-display-prompt",
                 "-ngl, --n-gpu-layers", "--raw", "--color", "--compare", "--trace", "examples:"):
        assert flag in run.stdout, flag
    for cmd in ("chat", "trace-report", "bench"):
        r = cli(cmd, "--help")
        assert r.returncode == 0 and "usage: specdec " + cmd in r.stdout


def test_speculative_run_streams_before_the_summary(tiny):
    """Merged stdout + stderr: progress, then the text as it is accepted, then one summary."""
    r = cli("run", "-m", tiny["target"], "-md", tiny["draft"], "-p", "hello", "-n", 24, "--ignore-eos",
            "--draft-n", 3, "--draft-p", 0, "--compare", "--color", "-ngl", 99, "-t", 1, merge=True)
    assert r.returncode == 0, r.stdout
    out = r.stdout
    assert "note: -ngl ignored" in out and "kernels ready" in out
    text_at = out.index("hello\n")                            # the echoed user prompt ...
    summary = SUMMARY.search(out)
    assert summary and text_at < summary.start()
    generated = out[text_at + len("hello\n"): summary.start()]
    assert re.search(r"\x1b\[3[214]m[a-zA-Z]+\x1b\[0m", generated)    # ... then coloured tokens
    line = out[summary.start():].splitlines()[0]
    assert "24 tokens" in line and "acceptance" in line and "speedup" in line and "same tokens" in line
    assert out[summary.start():].count("\n") == 1             # one line, nothing after it


def test_trace_and_trace_report(tiny, tmp_path):
    trace, png, prompt = tmp_path / "t.jsonl", tmp_path / "r.png", tmp_path / "prompt.txt"
    prompt.write_text("hello")
    r = cli("run", "-m", tiny["target"], "-md", tiny["draft"], "-f", prompt, "--raw", "-c", 48, "-n", -1,
            "--ignore-eos", "--draft-n", 4, "--draft-p", 0, "--temp", 1.0, "-s", 7, "--trace", trace, "-v",
            "--no-display-prompt")
    assert r.returncode == 0, r.stderr
    assert "specdec:" not in r.stdout and r.stdout.strip()    # stdout: only the generated text
    assert "stop: ctx_full" in r.stderr and "acceptance by draft position" in r.stderr
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert records and {"drafted", "accepted", "alpha", "ratio"} <= set(records[0])
    rep = cli("trace-report", trace, "-o", png)
    assert rep.returncode == 0, rep.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{len(records)} steps" in rep.stdout and "predicted 1 - TV(p, q)" in rep.stdout
    default = cli("trace-report", trace)
    assert default.returncode == 0 and trace.with_suffix(".png").exists()


def test_trace_report_bad_files(tmp_path):
    one_line_error(cli("trace-report", tmp_path / "none.jsonl"), "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0}\n')
    one_line_error(cli("trace-report", bad), "bad.jsonl", "line 1 is not a trace record")


def test_model_without_chat_template(tiny):
    r = cli("run", "-m", tiny["draft"], "-p", "hello", "-n", 3, "--ignore-eos")
    assert r.returncode == 0 and "has no chat template; the prompt is used as is" in r.stderr
    assert r.stdout.startswith("hello") and not r.stdout.startswith("hello\n")   # continued, not answered
    one_line_error(cli("run", "-m", tiny["draft"], "-sys", "be brief", "-p", "hello"), "no chat template")


def test_incompatible_pair_is_one_line(tiny):
    one_line_error(cli("run", "-m", tiny["target"], "-md", tiny["other"], "-p", "hi", "-n", 4),
                   "other.gguf")


@pytest.mark.parametrize("flags,needle", [
    (["--temp", "-1"], "--temp"), (["--raw", "-sys", "be brief"], "--raw"),
    (["-n", "-2"], "--n-predict"), (["-p", "a", "-f", "b"], "exclusive"),
])
def test_bad_flags_fail_before_loading(flags, needle):
    one_line_error(cli("run", "-m", "no-such-model", *flags), needle)


def test_chat_over_a_pipe_reuses_the_cache(tiny):
    r = cli("chat", "-m", tiny["target"], "-md", tiny["draft"], "-sys", "be", "-n", 6, "--ignore-eos",
            stdin="hello\nagain\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("> hello\n") and "\n> again\n" in r.stdout
    turns = [line for line in r.stderr.splitlines() if SUMMARY.match(line)]
    assert len(turns) == 2, r.stderr
    cached = [int(m) for m in re.findall(r"\((\d+) cached\)", r.stderr)]
    assert cached[0] == 0 and cached[1] > 0


def test_info_and_models(tiny, tmp_path):
    r = cli("info", tiny["target"])
    assert r.returncode == 0 and "architecture:  llama" in r.stdout and "52 tokens" in r.stdout
    from specdec.models import hub
    known = hub.list_models()
    (tmp_path / known[0]["path"].rsplit("/", 1)[-1]).write_bytes(b"GGUF")
    r = cli("models", env={"SPECDEC_HOME": str(tmp_path)})
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == len(known)
    assert "cached at" in lines[0] and all("not downloaded" in line for line in lines[1:])
    one_line_error(cli("info", "no-such-model"), "unknown model 'no-such-model'")


def test_bench_writes_json_and_plots(tiny, tmp_path):
    out = tmp_path / "bench"
    r = cli("bench", "-m", tiny["target"], "--pair", f"{tiny['target']}:{tiny['draft']}", "-n", 6,
            "--draft-n", 1, 3, "--repeats", 1, "-o", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["decode.json", "decode.png", "speedup.json",
                                                      "speedup.png"]
    spec = json.loads((out / "speedup.json").read_text())
    summary = spec["pairs"][0]["summary"]
    assert [s["draft_n"] for s in summary] == [1, 3] and all(s["all_identical"] for s in summary)
    assert json.loads((out / "decode.json").read_text())["results"][0]["tg64_tok_s"] > 0
    one_line_error(cli("bench", "--pair", "justone", "-o", tmp_path / "x"), "TARGET:DRAFT")


def test_bench_scripts_write_where_asked(tmp_path, monkeypatch):
    """--scripts runs benchmarks/NAME.py in benchmarks/; a relative -o still means the caller's
    folder (it used to land under benchmarks/), and replay is one of the scripts."""
    from pathlib import Path

    from specdec.frontends import bench
    calls = []

    class Done:
        returncode = 0

    monkeypatch.setattr(subprocess, "run", lambda cmd, cwd=None: calls.append((cmd, cwd)) or Done())
    monkeypatch.chdir(tmp_path)
    for name in ("drafters", "replay"):
        bench.run_script(name, Path("out"), log=lambda *a: None, mmap=False)
    for (cmd, cwd), name in zip(calls, ("drafters", "replay")):
        assert cmd[1].endswith(f"benchmarks/{name}.py") and cwd.name == "benchmarks"
        assert cmd[2:] == ["--out", str(tmp_path / "out"), "--no-mmap"]


def test_plots_without_matplotlib_are_one_line(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from specdec.frontends.cli import main; "
            f"sys.exit(main(['bench', '--no-speculative', '-m', 'x', '-o', {str(tmp_path)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    one_line_error(r, "matplotlib", "specdec[bench]")


def test_no_mmap_gives_the_same_text(tiny):
    args = ("run", "-m", tiny["target"], "-md", tiny["draft"], "-p", "hello", "-n", 12, "--ignore-eos",
            "--no-display-prompt", "-t", 1)
    a, b = cli(*args), cli(*args, "--no-mmap")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout and a.stdout.strip()
