"""`specdec serve`: the command line's parsed flags -> loaded models, a Scheduler, the app,
uvicorn.  specdec/frontends/cli.py parses the flags and hands over here (imported lazily, so the other
commands do not import FastAPI)."""
from __future__ import annotations

import os

from specdec.errors import ConfigError
from specdec.sampling import SamplerParams


def serve(a, *, load, draft_options, set_threads, log, quant=None) -> int:
    """Load -m (and -md), start the scheduler and serve until Ctrl-C / SIGTERM (then drain,
    exit 0).  load / draft_options / set_threads / log / quant: specdec.frontends.cli's
    helpers (quant(a, 'target' | 'draft'): the requantization flags)."""
    try:
        from .app import ServeConfig, create_app, run_server
    except ImportError as e:             # the optional server stack is not installed
        raise ConfigError(f"specdec serve needs {e.name or 'FastAPI and uvicorn'}: "
                          f"pip install 'specdec[serve]'") from None
    from .scheduler import DraftCaps, Scheduler
    if not 0 <= a.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {a.port}")
    if a.n_predict < -1:
        raise ConfigError(f"--n-predict must be >= -1, got {a.n_predict}")
    if a.ctx_size < 0 or a.threads < 0:
        raise ConfigError("--ctx-size and --threads must be >= 0")
    params = SamplerParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)
    options = draft_options(a)
    caps = DraftCaps.parse(a.draft_caps, a.lookup_caps)
    if a.threads:
        set_threads(a.threads)
    q = quant or (lambda a, role: (None, None))
    target = load(a.model, a.ctx_size, a.activations, a.mmap, q(a, "target"))
    draft = (load(a.draft_model, a.ctx_size, a.activations, a.mmap, q(a, "draft"))
             if a.draft_model else None)
    if draft is not None:                               # -md alone drafts with the model
        from specdec.speculation.compat import check_compatible
        check_compatible(target.tokenizer, draft.tokenizer, target.name, draft.name,
                         options.retokenize)
        options = options.with_model(draft)
    elif options.kind in ("model", "hybrid"):
        raise ConfigError(f"--draft {options.kind} needs a draft model (-md)")
    scheduler = Scheduler(target, n_parallel=a.parallel, n_ctx=a.ctx_size or None, draft=options,
                          caps=caps, max_queue=a.queue_size, prefill_chunk=a.prefill_chunk,
                          threads=a.threads, start=False)       # stepped by run_server
    ids = [a.alias] if a.alias else []
    for name in (a.model, os.path.basename(target.path), os.path.splitext(target.name)[0]):
        if name not in ids:
            ids.append(name)
    config = ServeConfig(tuple(ids), params, a.n_predict, None if a.seed in (None, -1) else a.seed,
                         draft)
    log(f"specdec: {a.parallel} slots of {scheduler.n_ctx} tokens, drafting: "
        f"{options.describe()}"
        + f"; greedy draft caps by batch size: model {caps.table}, prompt lookup {caps.lookup}")
    return run_server(create_app(scheduler, config), a.host, a.port, log=log, scheduler=scheduler)
