"""Soak test of `specdec serve`: C concurrent clients for N seconds (or R requests), a mix of
chat / completions, streamed and not, greedy and seeded sampled, with and without drafting,
some cancelled mid-stream, some malformed, some over the limits; then the same greedy and
seeded requests replayed on a fresh server.  Loopback only, bounded in time and requests,
stops by itself.

Asserted at the end (`check`): no response with a 5xx status; every greedy and seeded answer
identical to the fresh server's; the server's RSS after warm-up growing less than 5 %; every
slot idle and the queue empty in /metrics; as many open file descriptors as after warm-up.
Writes soak.json (requests, statuses, tokens, cancellations, the RSS / fd samples) and
soak.png (RSS over time).

    python benchmarks/soak.py -m smollm2-135m-instruct-q4_1 --seconds 600 --clients 4 --out benchmarks/results/intel
    python benchmarks/soak.py -m tiny.gguf -md tiny-draft.gguf --seconds 30      # CI-sized
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from common import machine_info, write_json

KEY = "soak-key"
LIMIT = 64                   # --max-tokens-limit of the soaked server
MAX_BODY = 1 << 16           # --max-body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """`specdec serve ARGS` on 127.0.0.1 with an API key and small limits."""

    def __init__(self, args: list[str], log: Path, timeout: float = 180):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {KEY}"}
        cmd = [sys.executable, "-m", "specdec.frontends.cli", "serve", *args, "--port", str(self.port),
               "--api-key", KEY, "--max-tokens-limit", str(LIMIT), "--max-body", str(MAX_BODY),
               "--body-timeout", "5"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not start")

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines()
                                          if ln and not ln.startswith("#"))}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def request_pool(drafts: list[str]) -> list[dict]:
    """The distinct well-formed requests (each a fixed body: greedy, or sampled with a seed)."""
    texts = ["abcabcab", "the cat sat on the", "def f(x):\n    return", "one two one two one",
             "xyzzy", "hello world hello"]
    pool = []
    for i, t in enumerate(texts):
        for j, d in enumerate(drafts):
            # sampled with a seed, except from the shared suffix store (its tokens depend on
            # what the store held: docs/serve.md)
            sampled = (i + j) % 3 == 2 and d != "suffix"
            body = {"max_tokens": 8 + (5 * i + 3 * j) % 40, "draft": d,
                    "temperature": 0.8 if sampled else 0.0, "ignore_eos": True}
            if sampled:        # a length setting: the adaptive default reads the clock (docs/serve.md)
                body.update(seed=100 + i, top_k=0, top_p=1.0, min_p=0.0, draft_n=4)
            if (i + j) % 2:
                body["messages"] = [{"role": "user", "content": t}]
            else:
                body["prompt"] = t
            pool.append(body)
    return pool


def bad_requests() -> list[tuple[str, bytes | dict, int]]:
    """(route, body, expected status): malformed or over a limit."""
    return [("/v1/completions", b"{not json", 400),
            ("/v1/completions", {"prompt": "ab", "max_tokens": LIMIT + 1}, 400),
            ("/v1/completions", {"prompt": "ab", "n": 2}, 400),
            ("/v1/completions", {"prompt": "ab", "logprobs": 21}, 400),
            ("/v1/chat/completions", {"messages": []}, 400),
            ("/v1/completions", {"prompt": "x" * (MAX_BODY + 10)}, 413)]


def route(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def answer(client: httpx.Client, url: str, body: dict, stream: bool, cancel: bool) -> tuple[int, str, int]:
    """(status, text, completion tokens) of one request; cancel: leave after the first chunk."""
    path = route(body)
    chat = "messages" in body
    if not stream:
        r = client.post(url + path, json=body)
        if r.status_code != 200:
            return r.status_code, "", 0
        j = r.json()
        text = j["choices"][0]["message"]["content"] if chat else j["choices"][0]["text"]
        return 200, text, j["usage"]["completion_tokens"]
    parts, n = [], 0
    with client.stream("POST", url + path, json={**body, "stream": True,
                                                 "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, "", 0
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                n = j["usage"]["completion_tokens"]
            for c in j.get("choices", []):
                parts.append((c.get("delta") or {}).get("content") or "" if chat else c.get("text") or "")
            if cancel:
                return 200, None, 0               # the client goes away mid-stream
    return 200, "".join(parts), n


def client_loop(server: ServeProcess, pool, seed: int, deadline: float, budget: list, log: list,
                lock: threading.Lock) -> None:
    rnd = random.Random(seed)
    bad = bad_requests()
    with httpx.Client(headers=server.headers, timeout=120) as client:
        while time.monotonic() < deadline:
            with lock:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
            u = rnd.random()
            t = time.monotonic()
            if u < 0.1:
                path, body, want = rnd.choice(bad)
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                status = client.post(server.url + path, content=content).status_code
                rec = {"kind": "bad", "status": status, "want": want}
            else:
                k = rnd.randrange(len(pool))
                stream, cancel = rnd.random() < 0.5, False
                cancel = stream and rnd.random() < 0.15
                try:
                    status, text, n = answer(client, server.url, pool[k], stream, cancel)
                except httpx.HTTPError as e:
                    status, text, n = -1, repr(e), 0
                rec = {"kind": "cancel" if cancel else ("stream" if stream else "full"), "pool": k,
                       "status": status, "text": text, "tokens": n}
            rec["s"] = round(time.monotonic() - t, 3)
            with lock:
                log.append(rec)


def run(args: list[str], seconds: float, clients: int, max_requests: int, drafts: list[str],
        workdir: Path, warmup: float = 20.0) -> dict:
    """The soak (after `warmup` seconds of the same load, whose requests are not counted: the
    RSS baseline is taken after it), then the replay on a fresh server; returns everything
    `figures` reads."""
    pool = request_pool(drafts)
    server = ServeProcess(args, workdir / "soak-server.log")
    try:
        with httpx.Client(headers=server.headers, timeout=120) as c:    # warm-up: every request once
            for body in pool:
                answer(c, server.url, body, stream=False, cancel=False)
        lock = threading.Lock()                 # ... then the load itself (batched passes of every
        warm = [threading.Thread(target=client_loop,      # size compile and size their buffers)
                                 args=(server, pool, 1000 + i, time.monotonic() + warmup, [10**9], [], lock))
                for i in range(clients)]
        for th in warm:
            th.start()
        for th in warm:
            th.join()
        rss0, fd0, t0 = server.rss_kb(), server.fds(), time.monotonic()
        samples = [(0.0, rss0, fd0)]
        log: list = []
        budget = [max_requests]
        deadline = t0 + seconds
        threads = [threading.Thread(target=client_loop, args=(server, pool, 17 + i, deadline, budget, log, lock))
                   for i in range(clients)]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            time.sleep(1.0)
            samples.append((round(time.monotonic() - t0, 1), server.rss_kb(), server.fds()))
        for th in threads:
            th.join()
        idle_deadline = time.monotonic() + 30            # cancelled streams free their slots
        while time.monotonic() < idle_deadline:
            m = server.metrics()
            if m.get("specdec_slots_busy", 0) == 0 and m.get("specdec_queue_length", 0) == 0:
                break
            time.sleep(0.2)
        fd_deadline = time.monotonic() + 10              # a connection still closing is not a leak:
        while server.fds() > fd0 and time.monotonic() < fd_deadline:   # a leaked descriptor stays
            time.sleep(0.2)
        end = {"metrics": m, "rss_kb": server.rss_kb(), "fds": server.fds()}
    finally:
        server.stop()
    fresh = ServeProcess(args, workdir / "soak-fresh.log")
    try:
        with httpx.Client(headers=fresh.headers, timeout=120) as c:
            want = {k: answer(c, fresh.url, body, stream=False, cancel=False)[1] for k, body in enumerate(pool)}
    finally:
        fresh.stop()
    return {"seconds": seconds, "clients": clients, "pool": pool, "log": log, "samples": samples,
            "rss0_kb": rss0, "fd0": fd0, "end": end, "fresh": want}


def figures(res: dict) -> dict:
    """The figures, and under "failures" every assertion of the module docstring that fails."""
    log = res["log"]
    statuses: dict = {}
    for r in log:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    differ = [r for r in log if r["kind"] in ("full", "stream") and r["status"] == 200
              and r["text"] != res["fresh"][r["pool"]]]
    wrong_bad = [r for r in log if r["kind"] == "bad" and r["status"] != r["want"]]
    peak = max(s[1] for s in res["samples"])
    m = res["end"]["metrics"]
    fig = {"requests": len(log), "statuses": statuses,
           "tokens": sum(r.get("tokens", 0) for r in log),
           "cancelled": sum(r["kind"] == "cancel" for r in log),
           "bad": sum(r["kind"] == "bad" for r in log), "answers_compared": sum(
               r["kind"] in ("full", "stream") and r["status"] == 200 for r in log),
           "answers_differing": len(differ), "bad_with_wrong_status": len(wrong_bad),
           "rss_after_warmup_kb": res["rss0_kb"], "rss_peak_kb": peak, "rss_end_kb": res["end"]["rss_kb"],
           "rss_growth": round(res["end"]["rss_kb"] / res["rss0_kb"] - 1, 4),
           "fds_after_warmup": res["fd0"], "fds_end": res["end"]["fds"],
           "slots_busy_end": m.get("specdec_slots_busy"), "queue_end": m.get("specdec_queue_length")}
    fails = []
    if any(s.startswith("5") or s == "-1" for s in statuses):
        fails.append(f"5xx or failed requests: {statuses}")
    if differ:
        fails.append(f"{len(differ)} answers differ from a fresh server's, e.g. {differ[0]}")
    if wrong_bad:
        fails.append(f"bad requests answered with the wrong status: {wrong_bad[:3]}")
    if fig["rss_growth"] >= 0.05:
        fails.append(f"RSS grew {fig['rss_growth']:.1%} after warm-up")
    if fig["fds_end"] > fig["fds_after_warmup"]:
        fails.append(f"file descriptors {fig['fds_after_warmup']} -> {fig['fds_end']}")
    if fig["slots_busy_end"] != 0 or fig["queue_end"] != 0:
        fails.append(f"not idle at the end: {m}")
    fig["failures"] = fails
    return fig


def check(res: dict) -> dict:
    """figures(res), or an AssertionError listing every check that failed."""
    fig = figures(res)
    if fig["failures"]:
        raise AssertionError("; ".join(fig["failures"]))
    return fig


def plot(res: dict, fig: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s[0] for s in res["samples"]]
    f, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(t, [s[1] / 1024 for s in res["samples"]], label="RSS (MiB)")
    ax.set_xlabel("seconds into the soak")
    ax.set_ylabel("server RSS, MiB")
    ax.set_title(f"specdec serve soak: {fig['requests']} requests, {res['clients']} clients, "
                 f"{fig['cancelled']} cancelled, {fig['bad']} bad; RSS {fig['rss_growth']:+.1%}", fontsize=9)
    f.tight_layout()
    f.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--draft-model", default=None)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=30, help="seconds of load before the RSS baseline")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-requests", type=int, default=100000)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--drafts", nargs="+", default=["none", "prompt-lookup", "suffix"])
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args(argv)
    args = ["-m", a.model, "-np", str(a.parallel), "-c", str(a.ctx_size)]
    drafts = list(a.drafts)
    if a.draft_model:
        args += ["-md", a.draft_model]
        drafts += ["model", "hybrid"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(args, a.seconds, a.clients, a.max_requests, drafts, out, a.warmup)
    fig = figures(res)
    write_json(out / "soak.json", {"machine": machine_info(), "args": args, "figures": fig,
                                   "samples": res["samples"], "log": res["log"]})
    plot(res, fig, out / "soak.png")
    print(json.dumps(fig, indent=1))
    return 1 if fig["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
