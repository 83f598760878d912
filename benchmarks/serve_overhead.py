"""Per-step cost of serving one request: the scheduler's step loop (in process and behind
HTTP) against `Runner.run` (the code path of `specdec run`) on the same greedy request.

Every target pass of the request goes through its session's `eval`; the benchmark wraps that
method on the session objects and records, per pass, wall time (perf_counter) and the calling
thread's CPU time (thread_time) at entry and exit.  Per decode step:
  step     entry of pass i+1 - entry of pass i   (the whole step: forward + everything else)
  forward  exit - entry of pass i                 (the forward pass itself)
  outside  step - forward                         (sampling, detokenizing, events, the loop)
Modes, interleaved round by round so a loaded machine loads them alike:
  run        Runner.run in the main thread (specdec run / Model.generate)
  scheduler  Scheduler.submit(Job).wait() in process (the scheduler thread, no HTTP)
  http       the FastAPI app under uvicorn in this process, one non-streamed
             /v1/chat/completions request over httpx (stream: --stream)
Medians over the decode steps of all rounds; the JSON (benchmarks/results/serve_overhead.json)
has the machine record (machine_info) and every mode's figures.

    python benchmarks/serve_overhead.py                       # smollm2-135m, 64 tokens, 3 rounds
    python benchmarks/serve_overhead.py --rounds 1 --n 16     # smoke
"""
from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's specdec
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_info, write_json  # noqa: E402

import specdec  # noqa: E402
from specdec.frontends.serve.app import create_app  # noqa: E402
from specdec.frontends.serve.jobs import ServeConfig  # noqa: E402
from specdec.frontends.serve.scheduler import Job, Scheduler  # noqa: E402
from specdec.api.request import Runner  # noqa: E402
from specdec.generation.sampling import SamplerParams  # noqa: E402

MODEL = "smollm2-135m-instruct-q4_1"
MESSAGES = [{"role": "user", "content": "Write a Python class for an LRU cache with get and put, "
                                        "and a short docstring for each method."}]
GREEDY = SamplerParams(temperature=0.0)


class PassLog:
    """Wraps session.eval on the given sessions: (wall, cpu) at entry and exit of each pass."""

    def __init__(self, sessions):
        self.rows: list[tuple[float, float, float, float, int]] = []
        for s in sessions:
            self._wrap(s)

    def _wrap(self, s) -> None:
        inner = s.eval

        def eval(tokens, last_only=False):
            w0, c0 = time.perf_counter(), time.thread_time()
            out = inner(tokens, last_only=last_only)
            self.rows.append((w0, c0, time.perf_counter(), time.thread_time(), len(tokens)))
            return out
        s.eval = eval

    def take(self) -> list:
        rows, self.rows = self.rows, []
        return rows


def steps_of(rows) -> dict[str, list[float]]:
    """Per decode step (pass 1..; pass 0 is the prompt): step / forward / outside, ms."""
    out = {"step_ms": [], "forward_ms": [], "outside_ms": [], "step_cpu_ms": [], "forward_cpu_ms": []}
    for a, b in zip(rows[1:], rows[2:]):
        out["step_ms"].append((b[0] - a[0]) * 1e3)
        out["forward_ms"].append((a[2] - a[0]) * 1e3)
        out["outside_ms"].append((b[0] - a[2]) * 1e3)
        out["step_cpu_ms"].append((b[1] - a[1]) * 1e3)
        out["forward_cpu_ms"].append((a[3] - a[1]) * 1e3)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http(sch: Scheduler, model_id: str):
    import uvicorn
    app = create_app(sch, ServeConfig(model_ids=(model_id,), params=GREEDY))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    return server, th, f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=MODEL)
    ap.add_argument("--n", type=int, default=64, help="tokens per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--stream", action="store_true", help="stream the HTTP request")
    ap.add_argument("--label", default="", help="a note stored in the JSON (e.g. 'before')")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "serve_overhead.json")
    a = ap.parse_args()

    model = specdec.load(a.model, n_ctx=a.ctx, progress=False)
    prompt = model.tokenize(model.chat_prompt(MESSAGES))
    sch = Scheduler(model, n_parallel=4, n_ctx=a.ctx)
    server, th, url = start_http(sch, a.model)
    log = PassLog(sch.sessions)
    body = {"messages": MESSAGES, "max_tokens": a.n, "temperature": 0, "ignore_eos": True,
            "stream": a.stream}

    modes = {}

    def record(name, rows, ids):
        m = modes.setdefault(name, {"steps": {}, "ids": ids})
        for k, v in steps_of(rows).items():
            m["steps"].setdefault(k, []).extend(v)
        assert m["ids"] == ids, f"{name}: another answer"

    for rnd in range(a.rounds + 1):                                # round 0: warm-up
        # run
        r = Runner(model, GREEDY, ignore_eos=True, n_ctx=a.ctx)
        own = PassLog([r.target])
        res = r.run(prompt, a.n)
        if rnd:
            record("run", own.take(), list(res.ids))
        # scheduler
        log.take()
        got = sch.submit(Job(list(prompt), a.n, GREEDY, ignore_eos=True)).wait(600)
        rows = log.take()
        if rnd:
            record("scheduler", rows, list(got.ids))
        # http
        with httpx.Client(timeout=600) as c:
            resp = c.post(url + "/v1/chat/completions", json=body)
            resp.raise_for_status()
        rows = log.take()
        if rnd:
            assert resp.json()["choices"][0]["message"]["content"] == model.detokenize(res.ids)
            record("http", rows, list(res.ids))
        print(f"round {rnd} done", file=sys.stderr)
    server.should_exit = True
    th.join(10)
    sch.close()

    out = {}
    for name, m in modes.items():
        s = m["steps"]
        out[name] = {k: round(float(np.median(v)), 3) for k, v in s.items()}
        out[name]["n_steps"] = len(s["step_ms"])
        out[name]["mean_step_ms"] = round(float(np.mean(s["step_ms"])), 3)
    base = out["run"]["step_ms"]
    for name in out:
        out[name]["step_over_run"] = round(out[name]["step_ms"] / base, 3)
    result = {"machine": machine_info(), "model": a.model, "n_predict": a.n, "rounds": a.rounds,
              "prompt_tokens": len(prompt), "stream": a.stream, "label": a.label,
              "method": __doc__.split("\n\n")[1], "modes": out}
    write_json(a.out, result)
    for name, v in out.items():
        print(f"{name:10s} step {v['step_ms']:8.2f} ms  forward {v['forward_ms']:8.2f}  outside "
              f"{v['outside_ms']:6.2f}  cpu/step {v['step_cpu_ms']:8.2f}  x run {v['step_over_run']:.3f}")


if __name__ == "__main__":
    main()
