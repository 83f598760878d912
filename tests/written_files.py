"""The agreement tests' files: written again by specdec.testing, checked against the SHA-256
llama.cpp's run recorded, and loaded; plus the router spy of the mixture-of-experts cases."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import specdec


def written_models(folder: Path, records: dict, write, stale: str) -> dict:
    """{name: Model, or the stale message} for each record {name: {"spec", "sha256"}}:
    write(path, spec fields) writes the file; stale.format(name, got, want) says what to run
    when the file written here is not the one llama.cpp ran."""
    out = {}
    for name, rec in records.items():
        spec = {k: tuple(v) if isinstance(v, list) else v for k, v in rec["spec"].items()}
        path = write(folder / f"{name}.gguf", spec)
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        out[name] = specdec.load(path, n_ctx=128) if got == rec["sha256"] else \
            stale.format(name=name, got=got[:12], want=rec["sha256"][:12])
    return out


def model_or_fail(models: dict, name: str):
    """The loaded model, or a failure (never a skip) when its file is not the one llama.cpp ran."""
    m = models[name]
    if isinstance(m, str):
        pytest.fail(m)
    return m


def route_margins(m, ids, monkeypatch) -> np.ndarray:
    """(P,) each position's smallest gap between its k-th and (k+1)-th router logits over the layers."""
    import specdec.engine.moe as moe_mod
    seen, real = [], moe_mod.route

    def spy(logits, k, norm, scale):
        top = np.sort(logits, axis=1)[:, ::-1]
        seen.append(top[:, k - 1] - top[:, k])
        return real(logits, k, norm, scale)
    monkeypatch.setattr(moe_mod, "route", spy)
    m.session(128).eval(ids)
    monkeypatch.undo()
    return np.min(seen, axis=0)
