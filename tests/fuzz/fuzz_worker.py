"""Fuzz worker: reads mutant paths (one per line) on stdin, writes one JSON outcome per line.

Each mutant is loaded with specdec and, if it loads, run through a forward pass and the
tokenizer.  Outcome: {"outcome": "ok" | "error" | "traceback" | "nonfinite" | "memory",
"msg": one line}.  A segfault or a hang is seen by the parent (fuzz_harness) as the
worker's death or silence.  Run as a script: python tests/fuzz/fuzz_worker.py
"""
from __future__ import annotations

import json
import resource
import sys
import traceback

import numpy as np


def check(path: str) -> dict:
    """The outcome of loading and running one file."""
    import specdec
    from specdec.errors import SpecdecError
    try:
        m = specdec.load(path, n_ctx=8, download=False, progress=False)
        ids = [i % m.config.n_vocab for i in (0, 1, 2)]
        logits = m.logits(ids)                                         # (3, n_vocab)
        m.detokenize(m.tokenize("hi <|im_end|> there"))
        if not np.isfinite(logits).all():
            return {"outcome": "nonfinite", "msg": "logits not finite"}
        return {"outcome": "ok", "msg": ""}
    except SpecdecError as e:
        msg = str(e)
        if "\n" in msg or not msg:
            return {"outcome": "traceback", "msg": f"multi-line or empty SpecdecError: {msg!r:.300}"}
        return {"outcome": "error", "msg": msg}
    except MemoryError:
        return {"outcome": "memory", "msg": "MemoryError"}
    except Exception as e:                                             # noqa: BLE001 (what we look for)
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"outcome": "traceback",
                "msg": f"{type(e).__name__}: {' '.join(str(e).split())[:200]} at {tb.filename}:{tb.lineno}"}


def main() -> None:
    limit = 6 << 30                    # a lying length must fail, not eat the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for warm in sys.argv[1:]:          # unmutated files: JIT compile / cache load before timing
        check(warm)
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        path = line.strip()
        if path:
            sys.stdout.write(json.dumps(check(path)) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
