"""`specdec serve`: the command line's parsed flags -> loaded models, a Scheduler, the app,
uvicorn.  specdec/frontends/cli.py parses the flags and hands over here (imported lazily, so the other
commands do not import FastAPI)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from ...errors import ConfigError
from ...generation.sampling import SamplerParams
from ...speculation.drafters import has_mtp


LOOPBACK = ("127.0.0.1", "localhost", "::1")
M_MMAP_THRESHOLD = -3             # glibc mallopt parameter


def pin_mmap_threshold(nbytes: int = 128 << 10) -> bool:
    """Fix glibc's mmap threshold (mallopt M_MMAP_THRESHOLD): by default glibc raises it to
    the largest block freed, so the logits arrays of a server's ever-changing batches (0.2-30
    MB) come from the heap and fragment it — the soak saw RSS creep by ~10 MB a minute; with a
    fixed threshold every block above it goes back to the system when freed (RSS flat,
    docs/robustness.md#soak).  False where there is no glibc."""
    import ctypes
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(nbytes)))
    except (OSError, AttributeError):
        return False


def api_keys(flags: list[str] | None, path: str | None, env: str | None) -> tuple[str, ...]:
    """The keys of --api-key (repeatable), --api-key-file (one a line; blank lines and
    #-comments skipped) and $SPECDEC_API_KEY, in that order, without repeats."""
    keys = list(flags or [])
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                keys += [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--api-key-file {path}: {getattr(e, 'strerror', None) or e}") from None
        if not keys:
            raise ConfigError(f"--api-key-file {path}: no key in it")
    if env:
        keys.append(env.strip())
    for k in keys:
        if not k or any(c.isspace() for c in k):
            raise ConfigError("--api-key: a key is a non-empty string without spaces")
    return tuple(dict.fromkeys(keys))


def open_warning(host: str, keys: tuple[str, ...]) -> str | None:
    """The start-up warning of a server reachable beyond this machine with no API key."""
    if keys or host in LOOPBACK or host.startswith("127."):
        return None
    return (f"specdec: warning: serving on {host} with no API key: anyone who reaches the port "
            f"can use it (--api-key KEY, --api-key-file FILE or $SPECDEC_API_KEY)")


def serve(a, *, load, draft_options, set_threads, log, quant=None) -> int:
    """Load -m (and -md), start the scheduler and serve until Ctrl-C / SIGTERM (then drain,
    exit 0).  load / draft_options / set_threads / log / quant: specdec.frontends.cli's
    helpers (quant(a, 'target' | 'draft'): the requantization flags).  (With --ray-replicas N
    the CLI runs ray.deploy instead: the same app as a Ray Serve deployment.)"""
    helpers = dict(load=load, draft_options=draft_options, set_threads=set_threads, log=log, quant=quant)
    app, scheduler = build(a, **helpers)
    from .lifecycle import run_server
    return run_server(app, a.host, a.port, log=log, scheduler=scheduler, drain_s=a.drain_timeout)


def check_flags(a) -> tuple[str, ...]:
    """The checks of the server flags that need no model (a ConfigError naming the flag);
    returns the API keys."""
    if not 0 <= a.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {a.port}")
    if a.n_predict < -1:
        raise ConfigError(f"--n-predict must be >= -1, got {a.n_predict}")
    if a.ctx_size < 0 or a.threads < 0:
        raise ConfigError("--ctx-size and --threads must be >= 0")
    if a.max_body < 1 or (a.max_tokens_limit is not None and a.max_tokens_limit < 1) or not a.body_timeout > 0:
        raise ConfigError("--max-body, --max-tokens-limit and --body-timeout must be > 0")
    if not a.drain_timeout >= 0:
        raise ConfigError(f"--drain-timeout must be >= 0 seconds, got {a.drain_timeout}")
    return api_keys(a.api_key, a.api_key_file, os.environ.get("SPECDEC_API_KEY"))


def build(a, *, load, draft_options, set_threads, log, quant=None):
    """(the FastAPI app, its Scheduler made with start=False: the caller steps it with
    `scheduler.run()`) of the serve flags: the models loaded in the calling thread's process,
    the slots allocated.  `specdec serve` and each Ray Serve replica build the same way."""
    try:
        from .app import create_app
        from .jobs import ServeConfig
    except ImportError as e:             # the optional server stack is not installed
        raise ConfigError(f"specdec serve needs {e.name or 'FastAPI and uvicorn'}: "
                          f"pip install 'specdec[serve]'") from None
    from .draft_caps import DraftCaps
    from .scheduler import Scheduler
    keys = check_flags(a)
    params = SamplerParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)
    options = draft_options(a)
    pin_mmap_threshold()
    caps = DraftCaps.parse(a.draft_caps, a.lookup_caps)
    if a.threads:
        set_threads(a.threads)
    q = quant or (lambda a, role: (None, None))
    jobs = [(a.model, "target")] + ([(a.draft_model, "draft")] if a.draft_model else [])
    with ThreadPoolExecutor(len(jobs)) as ex:          # side by side, as `specdec run`
        models = list(ex.map(lambda job: load(job[0], a.ctx_size, a.activations, a.mmap, q(a, job[1])), jobs))
    target, draft = models[0], (models[1] if len(models) > 1 else None)
    if draft is not None:                               # -md alone drafts with the model
        from ...speculation.compat import check_compatible
        check_compatible(target.tokenizer, draft.tokenizer, target.name, draft.name,
                         options.retokenize)
        options = options.with_model(draft)
    elif options.kind == "model" or (options.kind == "hybrid" and not has_mtp(target)):
        raise ConfigError(f"--draft {options.kind} needs a draft model (-md)")
    options = options.with_target(target)              # no -md: a target's own MTP head drafts
    scheduler = Scheduler(target, n_parallel=a.parallel, n_ctx=a.ctx_size or None, draft=options,
                          caps=caps, max_queue=a.queue_size, prefill_chunk=a.prefill_chunk,
                          threads=a.threads, start=False)       # stepped by run_server
    ids = [a.alias] if a.alias else []
    for name in (a.model, os.path.basename(target.path), os.path.splitext(target.name)[0]):
        if name not in ids:
            ids.append(name)
    config = ServeConfig(tuple(ids), params, a.n_predict, None if a.seed in (None, -1) else a.seed,
                         draft, api_keys=keys, max_body=a.max_body,
                         max_tokens_limit=a.max_tokens_limit, body_timeout=a.body_timeout,
                         webui=not getattr(a, "no_webui", False))
    warning = open_warning(a.host, keys)
    if warning:
        log(warning)
    log(f"specdec: {a.parallel} slots of {scheduler.n_ctx} tokens, drafting: "
        f"{options.describe()}"
        + f"; greedy draft caps by batch size: model {caps.table}, prompt lookup {caps.lookup}")
    return create_app(scheduler, config), scheduler
