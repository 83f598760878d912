"""`specdec` command line: llama-cli's flags over the same API a script uses.

    specdec run -m TARGET [-md DRAFT --draft-n 5 --draft-p 0.9] -p TEXT -n 128
    specdec chat -m TARGET [-md DRAFT] [-sys TEXT]
    specdec info FILE
    specdec pull NAME
    specdec models
    specdec trace-report TRACE.jsonl [-o OUT.png]
    specdec bench [-m MODEL ...] [--pair TARGET:DRAFT ...] [-o DIR]
    specdec serve -m TARGET [-md DRAFT] [--host 127.0.0.1] [--port 8080] [-np N] [-c CTX]
    specdec calibrate [-m TARGET] [-md DRAFT] [--json]

Every user error is one line on stderr and exit code 2.  Generated text goes to stdout as it
is produced; progress and the final summary go to stderr so stdout stays pipeable.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ..models import sources
from ..kernels import cpu
from ..engine import prepared
from .flags import build_parser
from .calibrate import cmd_calibrate
from .catalog import cmd_info, cmd_models, cmd_pull
from .console import COLORS, RESET, detail_lines, summary_line
from ..errors import ConfigError, SpecdecError


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _check_run_args(a) -> None:
    if a.predict is not None and a.prediction is not None:
        raise ConfigError("--predict and --prediction are exclusive")
    if (a.predict is not None or a.prediction is not None) and a.conversation:
        raise ConfigError("--predict / --prediction are for one answer: `specdec run` without -cnv")
    if a.prompt is not None and a.file is not None:
        raise ConfigError("--prompt and --file are exclusive")
    if a.raw and a.system_prompt is not None:
        raise ConfigError("-sys/--system-prompt needs the chat template; drop --raw")
    if a.raw and a.conversation:
        raise ConfigError("--raw and chat are exclusive: a chat needs the chat template")
    if a.trace and a.conversation:
        raise ConfigError("--trace is for `specdec run` without -cnv")
    if a.n_predict < -1:
        raise ConfigError(f"--n-predict must be >= -1, got {a.n_predict}")
    if a.seed is not None and a.seed < -1:
        raise ConfigError(f"--seed must be an integer >= 0 (or -1 for a random one), got {a.seed}")
    if a.temp < 0:
        raise ConfigError(f"--temp must be >= 0, got {a.temp}")
    if a.ctx_size < 0 or a.threads < 0:
        raise ConfigError("--ctx-size and --threads must be >= 0")


CONSTRAINT_FLAGS = (("--grammar", "grammar", "gbnf", False), ("--grammar-file", "grammar_file", "gbnf", True),
                    ("--json-schema", "json_schema", "json_schema", False),
                    ("--json-schema-file", "json_schema_file", "json_schema", True))


def _constraint(a):
    """The structured-output flags' ConstraintSpec, checked before any model loads (None:
    none given).  Bad input: one line naming the flag."""
    from ..errors import ConstraintError
    from ..generation.constraint import ConstraintSpec
    given = [(flag, getattr(a, dest), kind, is_file) for flag, dest, kind, is_file in CONSTRAINT_FLAGS
             if getattr(a, dest, None) is not None]
    if len(given) > 1:
        raise ConfigError(f"{given[0][0]} and {given[1][0]} are exclusive: give one constraint")
    if not given:
        return None
    flag, value, kind, is_file = given[0]
    if is_file:
        try:
            value = open(value, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{flag} {value}: {getattr(e, 'strerror', None) or e}") from None
    spec = ConstraintSpec(kind, value)
    try:
        spec.check()
    except ConstraintError as e:
        raise ConstraintError(f"{flag}: {str(e).split(': ', 1)[-1]}", e.field) from None
    return spec


def _draft_options(a):
    """The run flags' DraftOptions (validated here, before any model is loaded); the draft
    model is filled in once it is.  Also checks the requantization flags.  With --draft
    suffix or -lcd they carry the suffix store (read from the -lcd file when it exists; `main`
    writes it back at exit)."""
    from ..api.request import DraftOptions
    _quant(a, "target")
    _quant(a, "draft")
    store, kind = _suffix_store(a), a.draft
    if kind is None and a.lookup_cache and not a.draft_model:
        kind = "suffix"
    return DraftOptions(kind=kind, n=a.draft_n, p=a.draft_p, policy=a.draft_policy,
                        lookup_ngram_min=a.lookup_ngram_min, lookup_ngram_max=a.lookup_ngram_max,
                        lookup_copy_ratio=a.lookup_copy_ratio, vocab=a.draft_vocab,
                        retokenize=a.draft_retokenize, tree=a.draft_tree, suffix_store=store)


def _suffix_store(a):
    """The suffix store of -lcd / --draft suffix (made once per command), or None."""
    if getattr(a, "suffix_store", None) is None and (a.lookup_cache or a.draft == "suffix"):
        import os
        from ..speculation.drafters import SuffixStore
        if a.lookup_cache and os.path.exists(a.lookup_cache):
            a.suffix_store = SuffixStore.load(a.lookup_cache, a.lookup_cache_size)
            _progress(f"specdec: lookup cache {a.lookup_cache}: {len(a.suffix_store)} documents, "
                      f"{a.suffix_store.n_tokens} tokens")
        else:
            a.suffix_store = SuffixStore(a.lookup_cache_size)
    return getattr(a, "suffix_store", None)


def _save_suffix_store(a) -> None:
    """Write the suffix store back to the -lcd file (atomically), when there is one."""
    store = getattr(a, "suffix_store", None)
    if store is not None and getattr(a, "lookup_cache", None):
        store.save(a.lookup_cache)


def _quant(a, role: str) -> tuple[str | None, str | None]:
    """The (layers, head) requantization types of the target (--quant, --quant-head) or the
    draft model (--draft-quant, --draft-quant-head), checked (ConfigError naming the flag)."""
    from ..engine.requant import Requant
    from ..api.request import AUTO_DRAFT_QUANT
    pre = "draft_" if role == "draft" else ""
    layers, head = getattr(a, pre + "quant", None), getattr(a, pre + "quant_head", None)
    flag = "--draft-quant" if role == "draft" else "--quant"
    if role == "draft" and layers == "none":             # explicitly as stored
        layers = None
    elif (role == "draft" and layers is None and head is None and getattr(a, "draft_model", None)
          and all(getattr(a, k, None) is None for k in ("draft_n", "draft_p", "draft_policy"))):
        layers = AUTO_DRAFT_QUANT                        # the defaults' cheaper draft
    Requant.of(layers, head, flags=(flag, flag + "-head"))
    if role == "draft" and (layers or head) and not getattr(a, "draft_model", None):
        raise ConfigError(f"{flag if layers else flag + '-head'} needs a draft model (-md)")
    return layers, head


def _load(name: str, n_ctx: int, activations: str = "auto", mmap: bool | None = None,
          quant: tuple[str | None, str | None] = (None, None)):
    """Load a model (quant: its (layers, head) requantization types, see _quant)."""
    from ..api.model import load
    t0 = time.perf_counter()
    _progress(f"specdec: loading {name}" + (f" (layers requantized to {quant[0]})" if quant[0] else "")
              + (f" (head requantized to {quant[1]})" if quant[1] else "") + " ...")
    m = load(name, n_ctx=n_ctx or None, activations=activations, mmap=mmap,
             requant=quant[0], requant_head=quant[1])
    _progress(f"specdec: loaded {m.name} ({m.config.arch}, {m.config.n_layer} layers) in "
              f"{time.perf_counter() - t0:.1f} s; compiling kernels on first run (cached afterwards) ...")
    t0 = time.perf_counter()
    s = m.session(n_ctx=3)                              # JIT compile / cache load, once per process:
    s.eval([0, 0])                                      # the batched (prompt, verification) path
    s.eval([0])                                         # and the one-token path
    _progress(f"specdec: kernels ready in {time.perf_counter() - t0:.1f} s")
    return m


def _load_models(a):
    """(target, draft or None) of -m / -md, loaded side by side in two threads (reading files
    and the kernels release the GIL; a shared vocabulary is built once); -v prints where each
    load's time went."""
    jobs = [(a.model, "target")] + ([(a.draft_model, "draft")] if a.draft_model else [])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as ex:
        models = list(ex.map(lambda job: _load(job[0], a.ctx_size, a.activations, a.mmap, _quant(a, job[1])), jobs))
    if getattr(a, "verbose", False):
        for m, (_, role) in zip(models, jobs):
            _progress(f"specdec: {role} load: " + ", ".join(f"{k} {v:.2f} s" for k, v in m.load_times.items()))
        _progress(f"specdec: models ready in {time.perf_counter() - t0:.2f} s")
    return models[0], (models[1] if len(models) > 1 else None)


def _set_threads(n: int) -> None:
    from ..engine.thread_count import set_threads
    set_threads(n)                          # -t N: fixed; unset, chosen per pass (engine/thread_count.py)


def cmd_run(a) -> int:
    _check_run_args(a)
    options = _draft_options(a)
    constraint = _constraint(a)
    if constraint is not None and a.conversation:
        raise ConfigError("--grammar / --json-schema are for one answer: `specdec run` without -cnv")
    if a.n_gpu_layers is not None:
        _progress("specdec: note: -ngl ignored, specdec runs on the CPU")
    if a.threads:
        _set_threads(a.threads)
    if a.file is not None:
        try:
            with open(a.file, encoding="utf-8") as fh:
                prompt = fh.read()
        except OSError as e:
            raise ConfigError(f"--file {a.file}: {e.strerror}") from None
    else:
        prompt = a.prompt if a.prompt is not None else ""
    prediction = a.prediction
    if a.predict is not None:
        try:
            with open(a.predict, encoding="utf-8") as fh:
                prediction = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--predict {a.predict}: {getattr(e, 'strerror', None) or e}") from None
    target, draft = _load_models(a)
    if draft is not None:                               # -md alone drafts with the model
        options = options.with_model(draft)
    options = options.with_target(target)               # no -md: a target's own MTP head drafts
    if options.enabled or prediction is not None:
        _progress("specdec: drafting: " + (f"the prediction ({len(prediction)} characters), then "
                                            if prediction is not None else "") + options.describe())
    if a.conversation:
        return _chat(a, target, options, first=prompt or None)
    text, chat = _model_prompt(a, target, prompt)
    from .printer import TokenPrinter
    from ..speculation.trace import JsonlTrace
    if not a.no_display_prompt:
        sys.stdout.write(prompt + ("\n" if chat else ""))
        sys.stdout.flush()
    printer = TokenPrinter(target.tokenizer, sys.stdout, COLORS if a.color else None, RESET)
    speculative = options.enabled or prediction is not None
    trace = JsonlTrace(a.trace) if (a.trace and speculative) else None
    kw = dict(n_predict=_n_predict(a, target), temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
              min_p=a.min_p, seed=_seed(a), ignore_eos=a.ignore_eos, n_ctx=a.ctx_size or None)
    try:
        out = target.generate(text, draft=options, on_token=printer, trace=trace,
                              prediction=prediction, constraint=constraint, **kw)
    finally:
        if trace is not None:
            trace.close()
    printer.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    plain = target.generate(text, constraint=constraint, **kw) if (a.compare and speculative) else None
    _summary(out, a, plain)
    return 0


def _summary(out, a, plain=None) -> None:
    """One line (tokens, tok/s, acceptance, speedup with --compare); -v adds the details."""
    _progress(summary_line(out, plain))
    s = out.stats
    if a.verbose and s is not None:
        for line in detail_lines(out):
            _progress(line)
        if s.plan:
            _progress(f"specdec: drafting {s.plan}")
        for name, d in (s.by_drafter or {}).items():
            _progress(f"specdec: drafter {name}: {d.n_steps} steps, accepted {d.n_accepted}/{d.n_drafted}, "
                      f"predicted acceptance {d.predicted_acceptance:.1%} vs measured {d.measured_acceptance:.1%}")


def _n_predict(a, target) -> int:
    return a.n_predict if a.n_predict >= 0 else int(a.ctx_size or target.n_ctx)


def _seed(a) -> int | None:
    return None if a.seed is None or a.seed == -1 else a.seed


def _model_prompt(a, target, prompt: str) -> tuple[str, bool]:
    """(the text the model reads, whether it is wrapped in the chat template)."""
    if a.raw:
        return prompt, False
    if target.tokenizer.chat_template is None:
        if a.system_prompt is not None:
            raise ConfigError(f"{target.name} has no chat template (a base model): -sys needs one; "
                              f"put the text in the prompt")
        _progress(f"specdec: note: {target.name} has no chat template; the prompt is used as is")
        return prompt, False
    messages = [{"role": "system", "content": a.system_prompt}] if a.system_prompt is not None else []
    return target.chat_prompt([*messages, {"role": "user", "content": prompt}]), True


def _chat(a, target, options, first: str | None = None) -> int:
    """`specdec chat` and `specdec run -cnv`: an interactive Conversation."""
    from ..api.conversation import Conversation
    from .console import chat_loop
    if target.tokenizer.chat_template is None:
        _progress(f"specdec: note: {target.name} has no chat template; using ChatML")
    conv = Conversation(target, system=a.system_prompt, n_ctx=a.ctx_size or None,
                        temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                        seed=_seed(a), ignore_eos=a.ignore_eos, draft=options)
    return chat_loop(conv, _n_predict(a, target), first=first, colors=a.color, verbose=a.verbose)


def cmd_check(a) -> int:
    """`specdec check` (frontends/check.py): plain vs speculative on each prompt."""
    from . import check
    if not 0 < a.alpha < 1 or not 0 < a.shift < 1 or a.samples < 1:
        raise ConfigError("--alpha and --shift must be in (0, 1), --samples >= 1")
    if a.temp < 0:
        raise ConfigError(f"--temp must be >= 0, got {a.temp}")
    prompts = check.read_prompts(a.prompt, a.file)
    options = _draft_options(a)
    constraint = _constraint(a)
    if a.threads:
        _set_threads(a.threads)
    target, draft = _load_models(a)
    if draft is not None:
        options = options.with_model(draft)
    options = options.with_target(target)
    if not options.enabled:
        raise ConfigError("specdec check compares speculative with plain generation: give -md DRAFT "
                          "or --draft prompt-lookup / suffix")
    _progress(f"specdec: checking {len(prompts)} prompt(s), drafting: {options.describe()}")
    n, kw, bad = _n_predict(a, target), dict(n_ctx=a.ctx_size or None, constraint=constraint), 0
    for i, item in enumerate(prompts, 1):
        text = (target.chat_prompt(item["messages"]) if "messages" in item
                else _model_prompt(a, target, item["prompt"])[0])
        ids = target.tokenize(text)
        if a.temp == 0:
            r = check.check_greedy(target, ids, n, options, i, ignore_eos=a.ignore_eos, **kw)
            line = (f"identical ({r.n_tokens} tokens)" if r.identical else
                    f"differs at token {r.position}: {r.plain!r} plain, {r.speculative!r} speculative "
                    f"(target's top-2 logit margin there {r.margin:.4g})")
            ok = r.identical
        else:
            from ..generation.sampling import SamplerParams
            params = SamplerParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)
            r = check.check_sampled(target, ids, params, a.samples, options, i, a.shift, a.alpha,
                                    seed=_seed(a) or 0, **kw)
            line = (f"first token over {r.samples} samples: chi-square {r.chi2:.2f} over {r.n_bins} bins, "
                    f"p = {r.p_value:.3g} (plain control p = {r.plain_p_value:.3g}); power {r.power:.2f} "
                    f"against {a.shift:g} of p moved from its top token to the next; "
                    + ("consistent" if r.consistent else "NOT consistent") + f" at alpha {a.alpha:g}")
            ok = r.consistent
        bad += not ok
        print(f"prompt {i}: {line}", flush=True)
    print(f"specdec check: {len(prompts) - bad}/{len(prompts)} "
          + ("identical" if a.temp == 0 else "consistent with the target's law"))
    return 1 if bad else 0


def cmd_chat(a) -> int:
    if _constraint(a) is not None:
        raise ConfigError("--grammar / --json-schema are for one answer: `specdec run`")
    a.conversation = True
    return cmd_run(a)


def serve_helpers() -> dict:
    """What serve/launch.py's build needs from this module (the model loading and flag helpers),
    passed in so that the serve package never imports the CLI."""
    return dict(load=_load, draft_options=_draft_options, set_threads=_set_threads, log=_progress,
                quant=_quant)


def cmd_serve(a) -> int:
    if getattr(a, "ray_replicas", 0):                # the same app as a Ray Serve deployment
        from .serve.ray import deploy
        return deploy(a, **serve_helpers())
    from .serve.launch import serve
    return serve(a, **serve_helpers())


def cmd_trace_report(a) -> int:
    from .report import branches_line, trace_report
    out, s = trace_report(a.trace, a.output)
    by_pos = " ".join("-" if r["measured"] is None else f"{r['measured']:.2f}" for r in s["by_position"])
    print(f"{out}: {s['n_steps']} steps, {s['n_emitted']} tokens, {s['tokens_per_step']:.2f} tokens/step, "
          f"{s['acceptance_rate']:.1%} of drafted tokens accepted; at verified positions predicted "
          f"1 - TV(p, q) {s['predicted_acceptance']:.1%} vs measured {s['measured_acceptance']:.1%}; "
          f"by position: {by_pos or '-'}")
    if branches_line(s):
        print(branches_line(s))
    return 0


def cmd_bench(a) -> int:
    from . import bench
    if a.threads:
        _set_threads(a.threads)
    pairs = []
    default = ([] if a.no_speculative or getattr(a, "hf_pairs", None)
               else [f"{sources.DEFAULT_TARGET}:{sources.DEFAULT_DRAFT}"])
    for p in a.pair or default:
        target, sep, draft = p.partition(":")
        if not (sep and target and draft):
            raise ConfigError(f"--pair takes TARGET:DRAFT, got {p!r}")
        pairs.append((target, draft))
    pairs += getattr(a, "hf_pairs", [])
    models = [] if a.no_decode else (a.model or bench.DECODE_MODELS)
    from ..speculation.policies import check_draft_n
    for n in a.draft_n:
        check_draft_n(n)
    out_dir = a.out or bench.default_out_dir()
    _progress(f"specdec: benchmark results go to {out_dir}/")
    for path in bench.run(out_dir, models, pairs, n_predict=a.n_predict, draft_ns=a.draft_n,
                          repeats=a.repeats, scripts=a.scripts, log=_progress, mmap=False if a.no_mmap else None):
        print(path)
    return 0


def _hf_models(a) -> None:
    """-hf / -hfd as -m hf://REPO / -md hf://REPO (bench: one more model, or a pair)."""
    hf, hfd = getattr(a, "hf_repo", None), getattr(a, "hf_repo_draft", None)
    if a.command == "bench":
        if hfd and not hf:
            raise ConfigError("-hfd needs -hf (bench: the pair's target)")
        if hf and hfd:
            a.hf_pairs = [(f"hf://{hf}", f"hf://{hfd}")]
        elif hf:
            a.model = (a.model or []) + [f"hf://{hf}"]
        return
    if hf:
        a.model = f"hf://{hf}"
    if hfd:
        a.draft_model = f"hf://{hfd}"


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        _hf_models(a)
        if getattr(a, "no_prepared", False):
            os.environ[prepared.ENV] = "0"
        try:
            cpu.check_path()                    # SPECDEC_KERNELS names a path this host has
        except ValueError as e:
            raise ConfigError(str(e)) from None
        try:
            return {"run": cmd_run, "chat": cmd_chat, "check": cmd_check, "info": cmd_info, "pull": cmd_pull,
                    "models": cmd_models, "trace-report": cmd_trace_report, "bench": cmd_bench,
                    "serve": cmd_serve,
                    "calibrate": lambda a: cmd_calibrate(a, _draft_options, _load_models, _progress)}[a.command](a)
        finally:
            _save_suffix_store(a)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspecdec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
