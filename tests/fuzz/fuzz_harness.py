"""The GGUF fuzz run: mutants of synthetic and real files through worker subprocesses.

    run(bases, n, rng, workdir) -> Report

bases: [(name, path, kinds)], files to mutate; each mutant is written to workdir and checked
by a long-lived worker (fuzz_worker.py) that answers one JSON line per mutant.  A worker
that dies (segfault, abort) makes that mutant a `crash`, one that does not answer within
`timeout` seconds a `hang`; either way a fresh worker takes the remaining mutants.
Outcomes: ok, error (good); crash, hang, traceback, nonfinite, memory (failures).  Failing
mutants are kept in workdir/failures/ with their kind and detail, for reproduction.

Extending to other inputs (e.g. HTTP requests to a server): a worker that reads one case per
line and answers {"outcome", "msg"}, and a mutant generator yielding (kind, detail, bytes).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gguf_mutants import KINDS, mutants, scan

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fuzz_worker.py")
GOOD = ("ok", "error")
FAILURES = ("crash", "hang", "traceback", "nonfinite", "memory")


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)            # outcome -> mutants
    by_kind: dict = field(default_factory=dict)                 # kind -> Counter of outcomes
    failures: list = field(default_factory=list)                # dicts: base, kind, detail, outcome, msg
    errors: Counter = field(default_factory=Counter)            # first words of error messages
    n: int = 0
    seconds: float = 0.0
    restarts: int = 0

    def as_dict(self) -> dict:
        return {"n": self.n, "seconds": round(self.seconds, 1), "counts": dict(self.counts),
                "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
                "worker_restarts": self.restarts, "failures": self.failures,
                "top_errors": self.errors.most_common(25)}


class _Worker:
    def __init__(self, warm: list[str], src: Path = ROOT):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
        self.src = src
        self.p = subprocess.Popen([sys.executable, str(WORKER), *warm], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=src, env=env,
                                  text=True, bufsize=1)
        if self.read(600) is None:
            raise RuntimeError("fuzz worker did not start")

    def read(self, timeout: float):
        """The worker's next JSON line; None on death, 'hang' on silence."""
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            return "hang"
        line = self.p.stdout.readline()
        return json.loads(line) if line else None

    def ask(self, path: str, timeout: float) -> dict:
        try:
            self.p.stdin.write(path + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            return {"outcome": "crash", "msg": "worker gone"}
        got = self.read(timeout)
        if got == "hang":
            return {"outcome": "hang", "msg": f"no answer in {timeout:g} s"}
        if got is None:
            return {"outcome": "crash", "msg": f"worker died (exit {self.p.wait()})"}
        return got

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def run(bases: list[tuple[str, Path, tuple[str, ...]]], n: int, rng: np.random.Generator, workdir: Path,
        timeout: float = 30.0, src: Path = ROOT) -> Report:
    """n mutants spread over bases (in proportion to their share, round-robin over kinds);
    src: the source tree whose specdec the workers import (another checkout to compare)."""
    workdir = Path(workdir)
    (workdir / "failures").mkdir(parents=True, exist_ok=True)
    rep = Report()
    t0 = time.perf_counter()
    worker = _Worker([str(b[1]) for b in bases if not b[0].endswith("-header")], src)
    try:
        per = [n // len(bases) + (i < n % len(bases)) for i in range(len(bases))]
        for (name, path, kinds), count in zip(bases, per):
            buf = Path(path).read_bytes()
            lay = scan(buf)
            for i, (kind, detail, data) in enumerate(mutants(buf, lay, rng, count, kinds or KINDS)):
                mpath = workdir / f"m-{name}-{i}.gguf"
                mpath.write_bytes(data)
                res = worker.ask(str(mpath), timeout)
                if res["outcome"] in ("crash", "hang"):
                    worker.close()
                    rep.restarts += 1
                    worker = _Worker([], src)
                rep.n += 1
                rep.counts[res["outcome"]] += 1
                rep.by_kind.setdefault(kind, Counter())[res["outcome"]] += 1
                if res["outcome"] == "error":
                    rep.errors[_gist(res["msg"], str(mpath))] += 1
                if res["outcome"] in FAILURES:
                    keep = workdir / "failures" / mpath.name
                    mpath.replace(keep)
                    rep.failures.append({"base": name, "kind": kind, "detail": detail, "file": str(keep),
                                         "outcome": res["outcome"], "msg": res["msg"]})
                else:
                    mpath.unlink()
    finally:
        worker.close()
    rep.seconds = time.perf_counter() - t0
    return rep


def _gist(msg: str, path: str) -> str:
    """An error message without the file name and numbers: what kind of error it was."""
    msg = msg.replace(path, "FILE")
    words = [w for w in msg.split() if not any(c.isdigit() for c in w)][:7]
    return " ".join(words)


def cpu_model() -> str:
    from specdec.kernels.cpu import host
    return host().model_name
