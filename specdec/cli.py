"""`specdec` command line: llama-cli's flags over the same API a script uses.

    specdec run -m TARGET [-md DRAFT --draft-n 5 --draft-p 0.9] -p TEXT -n 128
    specdec info FILE
    specdec pull NAME
    specdec models

Every user error is one line on stderr and exit code 2.  Generated text goes to stdout as it
is produced; progress and the final summary go to stderr so stdout stays pipeable.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from . import hub
from .errors import ConfigError, SpecdecError

COLORS = {"accepted": "\x1b[32m", "correction": "\x1b[31m", "bonus": "\x1b[34m"}   # green, red, blue
RESET = "\x1b[0m"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (exit code 2)."""

    def error(self, message: str):
        raise ConfigError(f"{self.prog}: {message}")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", default=hub.DEFAULT_TARGET,
                   help=f"target model: a GGUF path or a known id (default: {hub.DEFAULT_TARGET})")
    g.add_argument("-md", "--draft-model", default=None,
                   help="draft model (path or known id) for speculative decoding")
    g.add_argument("--draft-n", "--draft-max", "--spec-draft-n-max", dest="draft_n", type=int, default=5,
                   help="tokens drafted per step, 1..16 (default: 5)")
    g.add_argument("--draft-p", "--draft-p-min", dest="draft_p", type=float, default=0.9,
                   help="stop drafting when the draft's top probability is below this (default: 0.9)")
    g.add_argument("-c", "--ctx-size", type=int, default=0, help="context size (default: min(4096, trained))")
    g.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: all cores)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None,
                   help="accepted for llama-cli compatibility; specdec runs on the CPU")
    g = p.add_argument_group("prompt")
    g.add_argument("-p", "--prompt", default=None, help="prompt text (special tokens recognised)")
    g.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    g.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default: 128)")
    g.add_argument("-s", "--seed", type=int, default=None, help="RNG seed (default: random)")
    g.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default: 0)")
    g.add_argument("--top-k", type=int, default=40, help="top-k sampling, 0 = off (default: 40)")
    g.add_argument("--top-p", type=float, default=0.95, help="top-p sampling, 1.0 = off (default: 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, help="min-p sampling, 0.0 = off (default: 0.05)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation")
    g = p.add_argument_group("speculation")
    g.add_argument("--compare", action="store_true",
                   help="also run the plain target-only request and report the speedup")
    g.add_argument("--trace", default=None, metavar="FILE.jsonl",
                   help="write one record per verification step (docs/trace-format.md)")
    g.add_argument("--color", action="store_true",
                   help="colour accepted (green), corrected (red) and bonus (blue) tokens")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="specdec", description="Exact speculative decoding of GGUF models on the CPU.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run_flags(sub.add_parser("run", help="generate text (speculatively with -md)",
                                  description="Generate text; with -md DRAFT, speculatively."))
    p = sub.add_parser("info", help="describe a GGUF model")
    p.add_argument("model", help="GGUF path or known id")
    p = sub.add_parser("pull", help="fetch a known model into the cache")
    p.add_argument("name", help="model id (see `specdec models`)")
    sub.add_parser("models", help="list known and cached models")
    return ap


def _check_run_args(a) -> None:
    if a.prompt is not None and a.file is not None:
        raise ConfigError("--prompt and --file are exclusive")
    if a.n_predict < 0:
        raise ConfigError(f"--n-predict must be >= 0, got {a.n_predict}")
    if not 1 <= a.draft_n <= 16:
        raise ConfigError(f"--draft-n must be in 1..16, got {a.draft_n}")
    if not 0.0 <= a.draft_p <= 1.0:
        raise ConfigError(f"--draft-p must be in [0, 1], got {a.draft_p}")
    if a.temp < 0:
        raise ConfigError(f"--temp must be >= 0, got {a.temp}")
    if a.ctx_size < 0 or a.threads < 0:
        raise ConfigError("--ctx-size and --threads must be >= 0")


def _load(name: str, n_ctx: int):
    from .api import load
    t0 = time.perf_counter()
    _progress(f"specdec: loading {name} ...")
    m = load(name, n_ctx=n_ctx or None)
    _progress(f"specdec: loaded {m.name} ({m.config.arch}, {m.config.n_layer} layers) in "
              f"{time.perf_counter() - t0:.1f} s; compiling kernels on first run (cached afterwards) ...")
    t0 = time.perf_counter()
    m.session(n_ctx=2).eval([0])                        # JIT compile / cache load, once per process
    _progress(f"specdec: kernels ready in {time.perf_counter() - t0:.1f} s")
    return m


def cmd_run(a) -> int:
    _check_run_args(a)
    if a.n_gpu_layers is not None:
        _progress("specdec: note: -ngl ignored, specdec runs on the CPU")
    if a.threads:
        import numba
        numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    if a.file is not None:
        try:
            prompt = open(a.file, encoding="utf-8").read()
        except OSError as e:
            raise ConfigError(f"--file {a.file}: {e.strerror}") from None
    else:
        prompt = a.prompt if a.prompt is not None else ""
    target = _load(a.model, a.ctx_size)
    draft = _load(a.draft_model, a.ctx_size) if a.draft_model else None
    from .printer import TokenPrinter
    from .trace import JsonlTrace
    if not a.no_display_prompt:
        sys.stdout.write(prompt)
        sys.stdout.flush()
    printer = TokenPrinter(target.tokenizer, sys.stdout, COLORS if a.color else None, RESET)
    trace = JsonlTrace(a.trace) if (a.trace and draft is not None) else None
    kw = dict(n_predict=a.n_predict, temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
              min_p=a.min_p, seed=a.seed, ignore_eos=a.ignore_eos, n_ctx=a.ctx_size or None)
    try:
        out = target.generate(prompt, draft=draft, draft_n=a.draft_n, draft_p=a.draft_p,
                              on_token=printer, trace=trace, **kw)
    finally:
        if trace is not None:
            trace.close()
    printer.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    _summary(out, a)
    if a.compare and draft is not None:
        plain = target.generate(prompt, **kw)
        same = "identical" if plain.ids == out.ids else "different (sampling)"
        speed = out.timings.tokens_per_s / plain.timings.tokens_per_s if plain.timings.tokens_per_s else 0.0
        _progress(f"specdec: plain target: {len(plain.ids)} tokens, {plain.timings.tokens_per_s:.2f} tok/s; "
                  f"speculative speedup {speed:.2f}x; outputs {same}")
    return 0


def _summary(out, a) -> None:
    t = out.timings
    line = (f"specdec: {len(out.ids)} tokens in {t.decode_s:.2f} s = {t.tokens_per_s:.2f} tok/s "
            f"(prompt {len(out.prompt_ids)} tokens in {t.prompt_s:.2f} s), stop: {out.stop_reason}")
    _progress(line)
    s = out.stats
    if s is not None:
        by_pos = " ".join("-" if r is None else f"{r:.2f}" for r in s.acceptance_by_position)
        _progress(f"specdec: steps {s.n_steps}, drafted {s.n_drafted}, accepted {s.n_accepted} "
                  f"({s.acceptance_rate:.1%}), {s.tokens_per_step:.2f} tokens/step, "
                  f"predicted acceptance {s.predicted_acceptance:.1%} vs measured {s.measured_acceptance:.1%}")
        _progress(f"specdec: acceptance by draft position: {by_pos}; draft {s.draft_s:.2f} s, "
                  f"verify {s.verify_s:.2f} s")


def cmd_info(a) -> int:
    from .config import ModelConfig
    from .gguf_file import GGUFFile
    from .tokenizer import Tokenizer
    path = hub.resolve(a.model, download=False)
    gf = GGUFFile(path)
    cfg = ModelConfig.from_gguf(gf)
    tok = Tokenizer.from_metadata(gf.metadata, str(path))
    n_params = sum(int(_prod(t.dims)) for t in gf.tensors.values())
    by_type: Counter = Counter()
    count: Counter = Counter()
    for t in gf.tensors.values():
        by_type[t.type_name] += t.n_bytes
        count[t.type_name] += 1
    print(f"file:          {path} ({gf.file_size / 1e6:.1f} MB)")
    print(f"name:          {gf.get('general.name', '?')}")
    print(f"architecture:  {cfg.arch}")
    print(f"parameters:    {n_params / 1e6:.1f} M")
    print(f"context:       {cfg.n_ctx_train} (trained)")
    print(f"layers:        {cfg.n_layer}, d_model {cfg.d_model}, heads {cfg.n_head} (kv {cfg.n_head_kv}), "
          f"head {cfg.d_head}, ffn {cfg.d_ff}")
    print(f"rope:          base {cfg.rope_base:g}, dims {cfg.rope_dim}, {'neox' if cfg.rope_type else 'norm'}")
    print(f"tokenizer:     {tok.vocab_type} ({gf.get('tokenizer.ggml.model')}, pre {tok.pre!r}), "
          f"{tok.n_vocab} tokens, BOS {tok.bos_id} (add: {tok.add_bos}), EOS {tok.eos_id}")
    print("tensor types:")
    for name, nbytes in by_type.most_common():
        print(f"  {name:6s} {count[name]:5d} tensors {nbytes / 1e6:10.1f} MB")
    return 0


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def cmd_pull(a) -> int:
    path = hub.resolve(a.name, download=True, progress=True)
    print(path)
    return 0


def cmd_models(a) -> int:
    for m in hub.list_models():
        state = f"cached at {m['path']}" if m["cached"] else "not downloaded"
        print(f"{m['id']:40s} {m['role']:8s} {m['size'] / 1e6:8.1f} MB  {state}")
    return 0


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        return {"run": cmd_run, "info": cmd_info, "pull": cmd_pull, "models": cmd_models}[a.command](a)
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
