"""`specdec calibrate`: measure what each pass size costs on this host, write the calibration the
drafting plan reads (speculation/calibration.py), and print the table.

The target and the draft are loaded as `specdec run` loads them with the same flags (the
defaults' requantized draft and draft vocabulary included), so the table is the one its
requests read; without a draft, a target with an MTP head has the head's step measured too
(the draft the defaults then use).  Measuring again replaces whatever the cache held.
"""
from __future__ import annotations

import json
import sys
from typing import Callable

from ..errors import ConfigError


def cmd_calibrate(a, draft_options: Callable, load_models: Callable, progress: Callable) -> int:
    """draft_options(a), load_models(a), progress(text): the CLI's (cli.py), as `run` uses them."""
    from ..engine.mtp_session import MTPModel
    from ..speculation import calibration
    from ..speculation.drafters import has_mtp
    if not calibration.enabled():
        raise ConfigError(f"calibration is off here ({calibration.ENV}=0 or {calibration.OVERRIDE} set): "
                          "unset them to measure")
    options = draft_options(a)
    target, draft = load_models(a)
    progress("specdec: measuring passes of " + ", ".join(str(m) for m in calibration.MEASURED_ROWS)
              + f" rows and a {calibration.PROMPT_ROWS}-token prompt ...")
    rows = {"target": (target, calibration.costs(target, fresh=True))}
    if draft is not None:
        rows["draft"] = (draft, calibration.costs(draft, n_logits=options.draft_vocab(draft), fresh=True))
    elif has_mtp(target):                               # the target's own MTP head drafts (api/drafting.py)
        head = MTPModel(target)
        rows["mtp"] = (head, calibration.costs(head, n_logits=options.draft_vocab(target), fresh=True, variant="mtp"))
    if a.json:
        json.dump({role: {"model": m.name, "row_ms": c.row_s * 1e3, "prompt_tok_ms": c.prefill_tok_s * 1e3,
                          "table": list(c.table), "file": str(calibration.cache_path(m.path, c.key))}
                   for role, (m, c) in rows.items()}, sys.stdout, indent=1)
        print()
        return 0
    for role, (m, c) in rows.items():
        print(f"{role} {m.name}: one row {c.row_s * 1e3:.1f} ms, prompt {c.prefill_tok_s * 1e3:.2f} ms/token"
              f" -> {calibration.cache_path(m.path, c.key)}")
        print("  rows M    " + " ".join(f"{m:>5d}" for m in range(1, calibration.TABLE_ROWS + 1)))
        print("  t(M)/t(1) " + " ".join(f"{c.rel(m):5.2f}" for m in range(1, calibration.TABLE_ROWS + 1)))
    return 0
