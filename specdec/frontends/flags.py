"""The `specdec` command's flags: llama-cli's and llama-server's names, grouped as their
--help groups them (model, loading, prompt, sampling, serving).  cli.py runs the commands."""
from __future__ import annotations

import argparse

from ..models import sources
from ..errors import ConfigError
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
        metavar = self._get_default_metavar_for_optional(action)
        return f"{', '.join(action.option_strings)} {self._format_args(action, metavar)}"


def _add_run_flags(p: argparse.ArgumentParser, serve: bool = False) -> None:
    """The model and sampling flags; with serve=False also the prompt and speculation ones."""
    g = p.add_argument_group("model")
    _add_model_flags(g)
    _add_load_flags(g)
    if serve:
        _add_sampling_flags(p, n_predict=-1)
        return
    _add_prompt_flags(p)


def _add_hf_flags(g) -> None:
    """-hf / -hfd (llama.cpp's): a Hugging Face repository's GGUF in place of -m / -md."""
    g.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="REPO[:QUANT]",
                   help="target from a Hugging Face repository (huggingface_hub's cache; QUANT picks "
                        "the file, default Q4_K_M); -m also takes hf://REPO[:QUANT] and ollama:NAME[:TAG]")
    g.add_argument("-hfd", "-hfrd", "--hf-repo-draft", dest="hf_repo_draft", default=None,
                   metavar="REPO[:QUANT]", help="draft model from a Hugging Face repository")


def _add_model_flags(g) -> None:
    """-m, -md and how the draft drafts (llama-cli / llama-server names)."""
    g.add_argument("-m", "--model", default=sources.DEFAULT_TARGET, metavar="FNAME",
                   help=f"target model: a GGUF path or a known id (default: {sources.DEFAULT_TARGET})")
    g.add_argument("-md", "--draft-model", "--model-draft", default=None, metavar="FNAME",
                   help="draft model (path or known id) for speculative decoding")
    _add_hf_flags(g)
    g.add_argument("--draft-n", "--draft-max", "--spec-draft-n-max", dest="draft_n", type=int, default=None,
                   metavar="N",
                   help=f"tokens drafted per step, 1..{DRAFT_N_MAX} (5 when --draft-p or --draft-policy "
                        "is given; default: the adaptive length in 1..8, see --draft)")
    g.add_argument("--draft-p", "--draft-p-min", dest="draft_p", type=float, default=None, metavar="P",
                   help="stop drafting when the draft's top probability is below this (0.9 when "
                        "--draft-n is given; default: the adaptive length)")
    g.add_argument("--draft", default=None, choices=("model", "prompt-lookup", "hybrid", "suffix", "forced", "mtp"),
                   help="who drafts: the -md model, forced (with --grammar / -j: the text the "
                        "grammar forces, no model; it is drafted first with any drafter), "
                        "prompt-lookup (copies what followed the last "
                        "n-gram earlier in the text), suffix (the most frequent continuation of "
                        "the longest match in the text and in earlier requests, --lookup-cache), "
                        "hybrid (lookup, else -md), mtp (the target's own multi-token-prediction "
                        "head: a Qwen3.5 MTP GGUF's nextn tensors). Default with -md: hybrid with the "
                        "adaptive length 1..8, or the model once --draft-n, --draft-p or "
                        "--draft-policy is given; with no -md, a target with an MTP head drafts "
                        "with it (hybrid: lookup, else the MTP head); with -lcd and no -md: suffix")
    g.add_argument("--draft-policy", default=None, choices=("fixed", "threshold", "adaptive"),
                   help="draft length: threshold (up to --draft-n, stop below --draft-p; the default "
                        "once --draft-n or --draft-p is given), fixed (--draft-n), adaptive (1..--draft-n "
                        "from measured acceptance and costs)")
    g.add_argument("--lookup-ngram-min", type=int, default=2,
                   help="prompt lookup: shortest n-gram matched (default: 2)")
    g.add_argument("--lookup-ngram-max", type=int, default=16,
                   help="prompt lookup: longest n-gram matched (default: 16)")
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
    g.add_argument("-c", "--ctx-size", type=int, default=0, metavar="N",
                   help="context size (default: min(4096, trained))")
    g.add_argument("-t", "--threads", type=int, default=0, metavar="N",
                   help="threads of the Numba kernels (default: chosen per pass by measurement, "
                        "up to all cores; docs/robustness.md)")
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
    _add_constraint_flags(p)
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


def _add_constraint_flags(p: argparse.ArgumentParser) -> None:
    """Structured output (llama-cli's names; docs/structured.md): at most one of them."""
    g = p.add_argument_group("structured output (pip install 'specdec[structured]')")
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="the output must match this GBNF grammar (llama.cpp's format)")
    g.add_argument("--grammar-file", default=None, metavar="FNAME", help="the GBNF grammar, from a file")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="the output must be JSON matching this JSON schema ('{}': any JSON object)")
    g.add_argument("-jf", "--json-schema-file", default=None, metavar="FNAME",
                   help="the JSON schema, from a file")


def _add_sampling_flags(p: argparse.ArgumentParser, n_predict: int = 128) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--n-predict", type=int, default=n_predict, metavar="N",
                   help=f"tokens to generate, -1 = until end of generation or a full context (default: {n_predict})")
    g.add_argument("-s", "--seed", type=int, default=None, metavar="SEED",
                   help="RNG seed, -1 = random (default: random)")
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
    g.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="after Ctrl-C / SIGTERM, seconds the running requests get to finish; the "
                        "ones still running then get 503 with Retry-After (default: 30)")
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
    p = sub.add_parser(
        "calibrate", help="measure what each pass size costs here (the drafting plan's table)",
        formatter_class=fmt, usage="specdec calibrate [-m MODEL] [-md DRAFT] [--json] [load flags]",
        description="Time passes of 1..17 rows and a prompt pass of the target (and the draft),\n"
                    "loaded as `specdec run` would with the same flags; write the calibration\n"
                    "the defaults read and print t(M)/t(1).  docs/speculative.md, \"What a pass costs\".")
    _add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print the tables as JSON")
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
    _add_hf_flags(p)
    p.add_argument("--pair", action="append", default=None, metavar="TARGET:DRAFT",
                   help=f"a speculative pair, repeatable (default: {sources.DEFAULT_TARGET}:{sources.DEFAULT_DRAFT})")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="output folder (default: specdec-bench-DATE-TIME)")
    p.add_argument("-n", "--n-predict", type=int, default=64, help="tokens per generation (default: 64)")
    p.add_argument("--draft-n", type=int, nargs="+", default=[2, 4, 6], metavar="N",
                   help="draft lengths to measure (default: 2 4 6)")
    p.add_argument("--repeats", type=int, default=1, help="best of R runs each (default: 1)")
    p.add_argument("--no-decode", action="store_true", help="skip the decode benchmark")
    p.add_argument("--no-speculative", action="store_true", help="skip the speculative benchmark")
    p.add_argument("-t", "--threads", type=int, default=0,
                   help="threads per forward pass (default: chosen per pass by measurement, up to all cores)")
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
