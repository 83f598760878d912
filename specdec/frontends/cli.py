"""`specdec` command line: llama-cli's flags over the same API a script uses.

    specdec run -m TARGET [-md DRAFT --draft-n 5 --draft-p 0.9] -p TEXT -n 128
    specdec chat -m TARGET [-md DRAFT] [-sys TEXT]
    specdec info FILE
    specdec pull NAME
    specdec models
    specdec trace-report TRACE.jsonl [-o OUT.png]
    specdec bench [-m MODEL ...] [--pair TARGET:DRAFT ...] [-o DIR]
    specdec serve -m TARGET [-md DRAFT] [--host 127.0.0.1] [--port 8080] [-np N] [-c CTX]

Every user error is one line on stderr and exit code 2.  Generated text goes to stdout as it
is produced; progress and the final summary go to stderr so stdout stays pipeable.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ..models import hub
from ..kernels import cpu
from ..engine import prepared
from .console import COLORS, RESET, detail_lines, summary_line
from ..errors import ConfigError, SpecdecError
from ..speculation.drafters.suffix import DEFAULT_STORE_TOKENS
from ..speculation.policies import DRAFT_N_MAX

EPILOG = """examples:
  specdec run -m qwen2.5-coder-1.5b-instruct-q4_k_m -md qwen2.5-coder-0.5b-instruct \\
      -p "Write a quicksort in Python." -n 256 --color
  specdec run -m model.gguf -f prompt.txt --raw -n 64 --temp 0.8 -s 42
  specdec chat -m smollm2-135m-instruct-q4_1 -sys "Answer in one sentence."

Models: a GGUF path or a known id (`specdec models`), fetched on first use.  Text goes to
stdout as it is accepted; progress and the summary go to stderr.  Exit codes: 0 ok,
2 bad input (one line on stderr), 130 interrupted."""

class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (exit code 2)."""

    def error(self, message: str):
        raise ConfigError(f"{self.prog}: {message}")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """llama-cli's help layout: `-m, --model FNAME    help`."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=34, width=100)

    def _format_action_invocation(self, action):
        if not action.option_strings or action.nargs == 0:
            return ", ".join(action.option_strings) or super()._format_action_invocation(action)
        return f"{', '.join(action.option_strings)} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_run_flags(p: argparse.ArgumentParser, serve: bool = False) -> None:
    """The model and sampling flags; with serve=False also the prompt and speculation ones."""
    g = p.add_argument_group("model")
    _add_model_flags(g)
    _add_load_flags(g)
    if serve:
        _add_sampling_flags(p, n_predict=-1)
        return
    _add_prompt_flags(p)


def _add_model_flags(g) -> None:
    """-m, -md and how the draft drafts (llama-cli / llama-server names)."""
    g.add_argument("-m", "--model", default=hub.DEFAULT_TARGET, metavar="FNAME",
                   help=f"target model: a GGUF path or a known id (default: {hub.DEFAULT_TARGET})")
    g.add_argument("-md", "--draft-model", "--model-draft", default=None, metavar="FNAME",
                   help="draft model (path or known id) for speculative decoding")
    g.add_argument("--draft-n", "--draft-max", "--spec-draft-n-max", dest="draft_n", type=int, default=None,
                   metavar="N",
                   help=f"tokens drafted per step, 1..{DRAFT_N_MAX} (5 when --draft-p or --draft-policy "
                        "is given; default: the adaptive length in 1..8, see --draft)")
    g.add_argument("--draft-p", "--draft-p-min", dest="draft_p", type=float, default=None, metavar="P",
                   help="stop drafting when the draft's top probability is below this (0.9 when "
                        "--draft-n is given; default: the adaptive length)")
    g.add_argument("--draft", default=None, choices=("model", "prompt-lookup", "hybrid", "suffix"),
                   help="who drafts: the -md model, prompt-lookup (copies what followed the last "
                        "n-gram earlier in the text), suffix (the most frequent continuation of "
                        "the longest match in the text and in earlier requests, --lookup-cache), "
                        "hybrid (lookup, else -md). Default with -md: hybrid with the adaptive "
                        "length 1..8, or the model once --draft-n, --draft-p or --draft-policy is "
                        "given; with -lcd and no -md: suffix")
    g.add_argument("--draft-policy", default=None, choices=("fixed", "threshold", "adaptive"),
                   help="draft length: threshold (up to --draft-n, stop below --draft-p; the default "
                        "once --draft-n or --draft-p is given), fixed (--draft-n), adaptive (1..--draft-n "
                        "from measured acceptance and costs)")
    g.add_argument("--lookup-ngram-min", type=int, default=2, help="prompt lookup: shortest n-gram matched (default: 2)")
    g.add_argument("--lookup-ngram-max", type=int, default=16, help="prompt lookup: longest n-gram matched (default: 16)")
    g.add_argument("--lookup-copy-ratio", type=float, default=1.0, metavar="R",
                   help="prompt lookup: a match of n tokens copies at most R*n tokens (0: --draft-n; default: 1)")
    g.add_argument("--draft-tree", type=int, default=1, metavar="K",
                   help="verify up to K candidate continuations per step in one target pass (a token "
                        "tree: prompt lookup's several matches, the draft model's K first tokens); "
                        "1: one linear draft (default); with --draft-policy fixed or threshold")
    g.add_argument("-lcd", "--lookup-cache", "--lookup-cache-dynamic", dest="lookup_cache", default=None,
                   metavar="FILE",
                   help="suffix store of earlier requests: read from FILE at start when it exists, "
                        "written back at exit; suffix and hybrid drafting look up in it")
    g.add_argument("--lookup-cache-size", type=int, default=DEFAULT_STORE_TOKENS, metavar="N",
                   help=f"tokens the suffix store keeps, least recently used documents evicted "
                        f"first (default: {DEFAULT_STORE_TOKENS})")
    g.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="the draft model computes logits for token ids < N only: a cheaper draft "
                        "over the common tokens, same output law (0: all; default: 32768 for "
                        "vocabularies over 65536 ids, else all)")
    g.add_argument("--draft-quant", default=None, metavar="TYPE",
                   help="requantize the draft model's layer matmuls at load into TYPE (q4_0, q5_0, "
                        "q8_0) where it is narrower than stored: a cheaper draft, same output law "
                        "(default: q4_0 when no --draft-n / --draft-p / --draft-policy is given; "
                        "none: as stored)")
    g.add_argument("--draft-quant-head", default=None, metavar="TYPE",
                   help="requantize the draft model's output head at load into TYPE (as --draft-quant)")


def _add_load_flags(g) -> None:
    """How the models are read and run: requantization, context, threads, mmap."""
    g.add_argument("--quant", default=None, metavar="TYPE",
                   help="requantize the -m model's layer matmuls at load into TYPE (q4_0, q5_0, q8_0) "
                        "where narrower than stored (a different, smaller model)")
    g.add_argument("--quant-head", default=None, metavar="TYPE",
                   help="requantize the -m model's output head at load into TYPE (as --quant)")
    g.add_argument("--draft-retokenize", action="store_true",
                   help="the -md model drafts through text: greedy drafts re-encoded into the "
                        "target's ids, so a draft with another tokenizer can draft (same output law)")
    g.add_argument("-c", "--ctx-size", type=int, default=0, metavar="N", help="context size (default: min(4096, trained))")
    g.add_argument("-t", "--threads", type=int, default=0, metavar="N",
                   help="threads of the Numba kernels (default: all cores)")
    g.add_argument("--activations", default="auto", choices=("auto", "q8", "float"),
                   help="matmul inputs: q8 rounds them to 8 bits per block like llama.cpp (faster), "
                        "float keeps them exact; auto: float for gemma3, q8 otherwise")
    g.add_argument("--mmap", dest="mmap", action="store_true", default=None,
                   help="map the model files (nothing copied; what llama-cli does by default)")
    g.add_argument("--no-mmap", dest="mmap", action="store_false", default=None,
                   help="read the model files into memory (default: read when a file takes at most "
                        "half the available memory, map it otherwise)")
    g.add_argument("--no-prepared", action="store_true",
                   help="neither read nor write prepared weights (the repacked / requantized layers "
                        "kept after a first load; SPECDEC_PREPARED=0 does the same)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None, metavar="N",
                   help="accepted for llama-cli compatibility; specdec runs on the CPU")


def _add_prompt_flags(p: argparse.ArgumentParser) -> None:
    """The prompt, sampling and speculation-output flags of run / chat / check."""
    g = p.add_argument_group("prompt")
    g.add_argument("-p", "--prompt", default=None, metavar="PROMPT", help="prompt text (special tokens recognised)")
    g.add_argument("-f", "--file", default=None, metavar="FNAME", help="read the prompt from a file")
    g.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    g.add_argument("-sys", "--system-prompt", default=None, metavar="TEXT",
                   help="system message for the chat template")
    g.add_argument("--raw", action="store_true",
                   help="use the prompt as is, without the model's chat template")
    g.add_argument("-cnv", "--conversation", action="store_true",
                   help="interactive chat after the prompt (as `specdec chat`)")
    _add_sampling_flags(p)
    g = p.add_argument_group("speculation")
    g.add_argument("--predict", default=None, metavar="FILE",
                   help="the answer is expected to be (mostly) this file's text, e.g. the code an "
                        "edit starts from: drafted first wherever the answer follows it")
    g.add_argument("--prediction", default=None, metavar="TEXT", help="as --predict, the text itself")
    g.add_argument("--compare", action="store_true",
                   help="also run the plain target-only request and report the speedup")
    g.add_argument("--trace", default=None, metavar="FILE.jsonl",
                   help="write one record per verification step (docs/trace-format.md)")
    g.add_argument("--color", action="store_true",
                   help="colour accepted (green; cyan from --predict), corrected (red) and bonus (blue) tokens")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="also print acceptance by draft position and draft/verify times")


def _add_sampling_flags(p: argparse.ArgumentParser, n_predict: int = 128) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--n-predict", type=int, default=n_predict, metavar="N",
                   help=f"tokens to generate, -1 = until end of generation or a full context (default: {n_predict})")
    g.add_argument("-s", "--seed", type=int, default=None, metavar="SEED", help="RNG seed, -1 = random (default: random)")
    g.add_argument("--temp", type=float, default=0.0, metavar="N", help="temperature; 0 = greedy (default: 0)")
    g.add_argument("--top-k", type=int, default=40, metavar="N", help="top-k sampling, 0 = off (default: 40)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="N", help="top-p sampling, 1.0 = off (default: 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, metavar="N", help="min-p sampling, 0.0 = off (default: 0.05)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation")


def _add_ray_flags(p: argparse.ArgumentParser) -> None:
    """`specdec serve` as a Ray Serve deployment (frontends/serve/ray.py, docs/serve.md)."""
    g = p.add_argument_group("ray serve (pip install 'specdec[ray]')")
    g.add_argument("--ray-replicas", type=int, default=0, metavar="N",
                   help="serve with N Ray Serve replicas behind Ray's HTTP proxy at --host/--port, each "
                        "with its own models, -np slots and -t threads (its num_cpus); 0: no Ray (default)")
    g.add_argument("--ray-max-replicas", type=int, default=None, metavar="N",
                   help="autoscale from --ray-replicas up to N replicas on queued requests "
                        "(default: a fixed --ray-replicas)")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="the Ray cluster to deploy on (default: $RAY_ADDRESS, else a Ray started on this "
                        "machine for the server's lifetime)")


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    _add_run_flags(p, serve=True)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    g.add_argument("-np", "--parallel", type=int, default=4, metavar="N",
                   help="slots: requests decoded at once in one batch (default: 4)")
    g.add_argument("--queue-size", type=int, default=64, metavar="N",
                   help="requests that may wait for a slot; more get 503 (default: 64)")
    g.add_argument("-a", "--alias", default=None, metavar="NAME",
                   help="model name in the API (default: the -m argument)")
    g.add_argument("--draft-caps", default=None, metavar="B:N,...",
                   help="most tokens a greedy request drafting with a model drafts per step from "
                        "batch size B up ('-': uncapped; default: 1:-,2:0, docs/serve.md)")
    g.add_argument("--lookup-caps", default=None, metavar="B:N,...",
                   help="the same for prompt lookup (default: 1:-,2:4,3:3,4:2,5:1,8:0)")
    g.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics (repeatable; "
                        "also --api-key-file and $SPECDEC_API_KEY; /health stays open)")
    g.add_argument("--api-key-file", default=None, metavar="FILE", help="API keys, one a line")
    g.add_argument("--max-body", type=int, default=8 << 20, metavar="BYTES",
                   help="largest request body; larger ones get 413 (default: 8 MiB)")
    g.add_argument("--max-tokens-limit", type=int, default=None, metavar="N",
                   help="most tokens a request may ask for (max_tokens); more get 400 "
                        "(default: the slot context)")
    g.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client may take to send its body; a slower one gets 408 and "
                        "its connection is closed (default: 30)")
    g.add_argument("--prefill-chunk", type=int, default=256, metavar="N",
                   help="while other requests decode, evaluate a long prompt N rows per step "
                        "(0: whole prompts at once; default: 256)")
    g.add_argument("--no-webui", action="store_true",
                   help="no chat page at / (default: one, docs/serve.md#the-chat-page)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="specdec", description="Exact speculative decoding of GGUF models on the CPU.",
                 epilog="`specdec COMMAND --help` describes a command; docs/cli.md all of them.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    fmt = _HelpFormatter
    _add_run_flags(sub.add_parser(
        "run", help="generate text (speculatively with -md)", formatter_class=fmt, epilog=EPILOG,
        usage="specdec run [-m MODEL] [-md DRAFT] [-p PROMPT | -f FILE] [-n N] [options]",
        description="Generate text from a prompt, in the model's chat template unless --raw;\n"
                    "with -md DRAFT, by exact speculative decoding: the same output law as the\n"
                    "target alone (greedy: the same tokens).  Flags follow llama-cli."))
    _add_run_flags(sub.add_parser(
        "chat", help="interactive multi-turn chat (keeps the KV caches)", formatter_class=fmt,
        epilog=EPILOG, usage="specdec chat [-m MODEL] [-md DRAFT] [-sys TEXT] [options]",
        description="Chat in the model's chat template, speculatively with -md.  Each turn\n"
                    "evaluates only its new tokens.  Ctrl-C stops an answer, Ctrl-D quits,\n"
                    "/clear starts afresh; -p gives the first turn."))
    p = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server with continuous batching", formatter_class=fmt,
        usage="specdec serve [-m MODEL] [-md DRAFT] [--host H] [--port P] [-np N] [-c CTX] [options]",
        description="Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models,\n"
                    "/health, /metrics) with speculative decoding and continuous batching; a\n"
                    "request's tokens never depend on the load.  Flags follow llama-server;\n"
                    "docs/serve.md describes the rest.  Ctrl-C / SIGTERM drain and exit.")
    _add_serve_flags(p)
    _add_ray_flags(p)
    p = sub.add_parser(
        "check", help="does speculation change anything on my prompts? (plain vs speculative)",
        formatter_class=fmt, epilog=EPILOG,
        usage="specdec check -m TARGET [-md DRAFT] [drafting flags] [-p TEXT | -f PROMPTS] [-n N] "
              "[--temp T --samples K]",
        description="Generate each prompt plainly and speculatively and compare: greedy, the\n"
                    "tokens must be the same (the first divergence is reported with the\n"
                    "target's top-2 margin there); with --temp T --samples K, a chi-square test\n"
                    "of the first token's distribution against the target's exact law.  -f:\n"
                    "one prompt a line, or JSONL with 'prompt' or 'messages'.  Exit 0: all\n"
                    "the same; 1: a difference; 2: bad input.")
    _add_run_flags(p)
    g = p.add_argument_group("check")
    g.add_argument("--samples", type=int, default=200, metavar="K",
                   help="seeded runs of each per prompt with --temp > 0 (default: 200)")
    g.add_argument("--alpha", type=float, default=0.01, help="significance of the test (default: 0.01)")
    g.add_argument("--shift", type=float, default=0.05,
                   help="the alternative the power is stated against: this much of p's mass moved "
                        "from its most likely token to the next (default: 0.05)")
    p = sub.add_parser("trace-report", help="plot a speculative trace (--trace FILE.jsonl) as a PNG",
                       description="Acceptance by draft position, the distribution of p/q, tokens "
                                   "per step and predicted vs measured acceptance, as one PNG. "
                                   "Needs matplotlib (pip install 'specdec[bench]').")
    p.add_argument("trace", metavar="FILE.jsonl", help="trace written by `specdec run --trace`")
    p.add_argument("-o", "--output", default=None, metavar="OUT.png",
                   help="where to write the PNG (default: FILE.png)")
    p = sub.add_parser("bench", help="decode and speculative benchmarks: JSON and PNG plots",
                       description="Decode speed per model (pp64/tg64 beside llama.cpp) and "
                                   "speculative vs plain generation per target:draft pair; writes "
                                   "decode.json/png and speedup.json/png into a folder.  "
                                   "Needs matplotlib (pip install 'specdec[bench]').")
    p.add_argument("-m", "--model", nargs="+", default=None, metavar="MODEL",
                   help="models for the decode benchmark (default: the four known models)")
    p.add_argument("--pair", action="append", default=None, metavar="TARGET:DRAFT",
                   help=f"a speculative pair, repeatable (default: {hub.DEFAULT_TARGET}:{hub.DEFAULT_DRAFT})")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="output folder (default: specdec-bench-DATE-TIME)")
    p.add_argument("-n", "--n-predict", type=int, default=64, help="tokens per generation (default: 64)")
    p.add_argument("--draft-n", type=int, nargs="+", default=[2, 4, 6], metavar="N",
                   help="draft lengths to measure (default: 2 4 6)")
    p.add_argument("--repeats", type=int, default=1, help="best of R runs each (default: 1)")
    p.add_argument("--no-decode", action="store_true", help="skip the decode benchmark")
    p.add_argument("--no-speculative", action="store_true", help="skip the speculative benchmark")
    p.add_argument("-t", "--threads", type=int, default=0, help="Numba threads (default: all cores)")
    p.add_argument("--no-mmap", action="store_true",
                   help="read the model files into memory (llama.cpp too; default: specdec's own choice, "
                        "which llama.cpp then follows)")
    p.add_argument("--scripts", nargs="+", default=(), choices=("speculative", "drafters", "replay"),
                   help="also run these benchmarks/*.py of a source checkout (their own defaults; long)")
    p = sub.add_parser("info", help="describe a GGUF model")
    p.add_argument("model", help="GGUF path or known id")
    p = sub.add_parser("pull", help="fetch a known model into the cache")
    p.add_argument("name", help="model id (see `specdec models`)")
    sub.add_parser("models", help="list known and cached models")
    return ap


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
    import numba
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def cmd_run(a) -> int:
    _check_run_args(a)
    options = _draft_options(a)
    if a.n_gpu_layers is not None:
        _progress("specdec: note: -ngl ignored, specdec runs on the CPU")
    if a.threads:
        _set_threads(a.threads)
    if a.file is not None:
        try:
            prompt = open(a.file, encoding="utf-8").read()
        except OSError as e:
            raise ConfigError(f"--file {a.file}: {e.strerror}") from None
    else:
        prompt = a.prompt if a.prompt is not None else ""
    prediction = a.prediction
    if a.predict is not None:
        try:
            prediction = open(a.predict, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--predict {a.predict}: {getattr(e, 'strerror', None) or e}") from None
    target, draft = _load_models(a)
    if draft is not None:                               # -md alone drafts with the model
        options = options.with_model(draft)
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
                              prediction=prediction, **kw)
    finally:
        if trace is not None:
            trace.close()
    printer.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    plain = target.generate(text, **kw) if (a.compare and speculative) else None
    _summary(out, a, plain)
    return 0


def _summary(out, a, plain=None) -> None:
    """One line (tokens, tok/s, acceptance, speedup with --compare); -v adds the details."""
    _progress(summary_line(out, plain))
    s = out.stats
    if a.verbose and s is not None:
        for line in detail_lines(out):
            _progress(line)
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
    if a.threads:
        _set_threads(a.threads)
    target, draft = _load_models(a)
    if draft is not None:
        options = options.with_model(draft)
    if not options.enabled:
        raise ConfigError("specdec check compares speculative with plain generation: give -md DRAFT "
                          "or --draft prompt-lookup / suffix")
    _progress(f"specdec: checking {len(prompts)} prompt(s), drafting: {options.describe()}")
    n, kw, bad = _n_predict(a, target), dict(n_ctx=a.ctx_size or None), 0
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
    a.conversation = True
    return cmd_run(a)


def serve_helpers() -> dict:
    """What serve/cli.py's build needs from this module (the model loading and flag helpers),
    passed in so that the serve package never imports the CLI."""
    return dict(load=_load, draft_options=_draft_options, set_threads=_set_threads, log=_progress,
                quant=_quant)


def cmd_serve(a) -> int:
    if getattr(a, "ray_replicas", 0):                # the same app as a Ray Serve deployment
        from .serve.ray import deploy
        return deploy(a, **serve_helpers())
    from .serve.cli import serve
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
    for p in a.pair or ([] if a.no_speculative else [f"{hub.DEFAULT_TARGET}:{hub.DEFAULT_DRAFT}"]):
        target, sep, draft = p.partition(":")
        if not (sep and target and draft):
            raise ConfigError(f"--pair takes TARGET:DRAFT, got {p!r}")
        pairs.append((target, draft))
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


def cmd_info(a) -> int:
    from ..engine.config import ModelConfig
    from ..engine.gguf_file import GGUFFile
    from ..text.tokenizer import Tokenizer
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
    scaling = [f"linear x{1 / cfg.rope_freq_scale:g}"] if cfg.rope_freq_scale != 1.0 else []
    if "rope_freqs.weight" in gf.tensors:
        scaling.append("rope_freqs (Llama 3.1 frequency factors)")
    print(f"rope:          base {cfg.rope_base:g}, dims {cfg.rope_dim}, {'neox' if cfg.rope_type else 'norm'}"
          f"{', scaling: ' + ', '.join(scaling) if scaling else ''}")
    if cfg.no_rope_period:
        print(f"no RoPE:       on layers {', '.join(str(i) for i in range(cfg.n_layer) if not cfg.uses_rope(i))}")
    if cfg.sliding_window:
        print(f"sliding window: {cfg.sliding_window} tokens on 5 of every {cfg.swa_period} layers "
              f"(local RoPE base {cfg.rope_base_local:g})")
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
    models = hub.list_models()
    w_id, w_role = (max(len(m[k]) for m in models) for k in ("id", "role"))
    for m in models:
        state = f"cached at {m['path']}" if m["cached"] else "not downloaded"
        print(f"{m['id']:{w_id}s}  {m['role']:{w_role}s} {m['size'] / 1e6:8.1f} MB  {state}")
    folders = prepared.listing()
    if folders:
        print(f"prepared weights in {prepared.root()} (delete the folder to clear them):")
        for name, size in folders:
            print(f"  {name}  {size / 1e6:8.1f} MB")
    return 0


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        if getattr(a, "no_prepared", False):
            os.environ[prepared.ENV] = "0"
        try:
            cpu.check_path()                    # SPECDEC_KERNELS names a path this host has
        except ValueError as e:
            raise ConfigError(str(e)) from None
        try:
            return {"run": cmd_run, "chat": cmd_chat, "check": cmd_check, "info": cmd_info, "pull": cmd_pull,
                    "models": cmd_models, "trace-report": cmd_trace_report, "bench": cmd_bench,
                    "serve": cmd_serve}[a.command](a)
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
