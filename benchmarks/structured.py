"""Structured output on the CPU: JSON-schema extraction and tool calls, constrained decoding
plain and with every drafter, beside llama-server with the same json_schema, greedy, the
default pair (Qwen2.5-Coder 1.5B Q4_K_M target, 0.5B draft), one process.

Prompts: benchmarks/prompts/structured.jsonl — `extraction` rows (a text, a JSON schema the
answer must follow) and `tool_call` rows (OpenAI tools rendered by the model's own chat
template, tool_choice naming the function: api/tools.py's grammar, the answer one
<tool_call> block).

Configurations (each prompt, each timed from the call to its return, prefill included):
    plain             the constraint alone, no drafting (the reference law)
    forced            the grammar's forced tokens drafted, nothing else (draft='forced')
    model             the 0.5B draft model (threshold policy, n 5, p 0.9: llama.cpp's)
    prompt-lookup     n-grams of the prompt
    suffix            the suffix drafter
    defaults          the defaults (draft= the model: hybrid lookup / model, adaptive length)
Under a constraint every drafter drafts the grammar's forced tokens first wherever the grammar
forces text (speculation/constrained.py), so model, prompt-lookup, suffix and defaults are
each "forced + that drafter"; `defaults` is forced-token drafting with the defaults.
    llama-plain       llama-server -m T, /completion with the same json_schema
    llama-md          llama-server -m T -md D (draft 5, p-min 0.9), the same
llama-server answers each tool row after the prompt and "<tool_call>\\n", with the schema of the
call object {"name": const, "arguments": parameters}: the same text our grammar writes there.

Reported per configuration: wall tokens/s (all tokens / all wall seconds), speedup over
plain, tokens per target pass, the share of outputs valid against their schema (jsonschema
when installed, else a validator for the subset the prompts use) and the share whose ids
equal plain's; and the mask cost: every plain output replayed through a fresh matcher, the
mean milliseconds of one mask + advance, against plain's decode milliseconds per token.

    python benchmarks/structured.py --limit 2 --out /tmp/s          # a quick check
    python benchmarks/structured.py --out benchmarks/results/intel  # the real run
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import QWEN_DRAFT, QWEN_TARGET, load_prompts, machine_info, write_json

SPECDEC = ("plain", "forced", "model", "prompt-lookup", "suffix", "defaults")
LLAMA = ("llama-plain", "llama-md")


# ---- prompts and validity ---------------------------------------------------------------------

def call_schema(tool: dict) -> dict:
    """The JSON object of one call of `tool` (what llama-server is asked for on tool rows)."""
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
            "required": ["name", "arguments"], "additionalProperties": False}


def prepare(target, rows: list[dict]) -> list[dict]:
    """Each row's prompt text, ConstraintSpec and the schema its output is checked against."""
    from specdec.api import tools as T
    from specdec.generation.constraint import ConstraintSpec
    from specdec.text.template import chat_prompt
    out = []
    for r in rows:
        if r["kind"] == "tool_call":
            tools = T.check_tools(r["tools"])
            tool = next(t for t in r["tools"] if t["function"]["name"] == r["tool_choice"])
            prompt = T.chat_prompt(target.tokenizer, r["messages"], tools, r["tool_choice"])
            spec = T.constraint(tools, r["tool_choice"])
            out.append({**r, "prompt": prompt, "spec": spec, "check": tool["function"]["parameters"],
                        "llama_prompt": prompt + "<tool_call>\n", "llama_schema": call_schema(tool)})
        else:
            prompt = chat_prompt(target.tokenizer, r["messages"])
            out.append({**r, "prompt": prompt, "spec": ConstraintSpec("json_schema", json.dumps(r["schema"])),
                        "check": r["schema"], "llama_prompt": prompt, "llama_schema": r["schema"]})
    return out


def _valid(x, s: dict) -> bool:
    """x against the schema subset the prompts use (type, properties, required,
    additionalProperties, items, enum, const) — jsonschema's answer when it is installed."""
    try:
        import jsonschema
        return jsonschema.Draft202012Validator(s).is_valid(x)
    except ImportError:
        pass
    if "const" in s and x != s["const"] or "enum" in s and x not in s["enum"]:
        return False
    t = s.get("type")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool}
    if t in kinds and not isinstance(x, kinds[t]):
        return False
    numeric = int if t == "integer" else (int, float)
    if t in ("integer", "number") and (isinstance(x, bool) or not isinstance(x, numeric)):
        return False
    if t == "object":
        props = s.get("properties", {})
        if any(k not in x for k in s.get("required", ())) or (
                s.get("additionalProperties") is False and any(k not in props for k in x)):
            return False
        return all(_valid(v, props[k]) for k, v in x.items() if k in props)
    if t == "array":
        return all(_valid(v, s.get("items", {})) for v in x)
    return True


def valid(row: dict, text: str, llama: bool = False) -> bool:
    """Does the output follow its schema (a tool row: one call of the named function whose
    arguments follow its parameters; llama-server's tool rows: the call object)?"""
    from specdec.api import tools as T
    try:
        if llama:
            return _valid(json.loads(text), row["llama_schema"])
        if row["kind"] == "tool_call":
            content, calls = T.parse(text)
            return (content is None and len(calls) == 1 and calls[0].name == row["tool_choice"]
                    and _valid(json.loads(calls[0].arguments), row["check"]))
        return _valid(json.loads(text), row["check"])
    except ValueError:
        return False


# ---- specdec ------------------------------------------------------------------------------------

def options(name: str, draft, store):
    """generate()'s drafting keywords of one configuration."""
    from specdec import DraftOptions
    model = DraftOptions(kind="model", model=draft, n=5, p=0.9, policy="threshold")
    return {"plain": {}, "model": {"draft": model},
            "prompt-lookup": {"draft": DraftOptions(kind="prompt-lookup")},
            "suffix": {"draft": DraftOptions(kind="suffix", suffix_store=store)},
            "defaults": {"draft": draft}, "forced": {"draft": "forced"}}[name]


def run_specdec(name: str, target, draft, rows: list[dict], n_predict: int) -> list[dict]:
    import specdec
    kw = options(name, draft, specdec.SuffixStore())
    out = []
    for r in rows:
        t = time.perf_counter()
        res = target.generate(r["prompt"], n_predict, constraint=r["spec"], **kw)
        wall = time.perf_counter() - t
        s = res.stats
        out.append({"id": r["id"], "kind": r["kind"], "wall_s": wall, "decode_s": res.timings.decode_s,
                    "n_tokens": len(res.ids), "passes": s.n_steps if s else len(res.ids),
                    "drafted": s.n_drafted if s else 0, "accepted": s.n_accepted if s else 0,
                    "stop": res.stop_reason, "ids": list(res.ids), "text": res.text,
                    "valid": valid(r, res.text)})
    return out


def mask_cost(target, rows: list[dict], plain: list[dict]) -> dict:
    """Each plain output replayed through a fresh matcher: ms per mask + advance."""
    from specdec.generation.constraint import compile_constraint
    n, secs, worst = 0, 0.0, 0.0
    for r, p in zip(rows, plain):
        c = compile_constraint(r["spec"], target.tokenizer, target.config.n_vocab)
        for tok in p["ids"]:
            t = time.perf_counter()
            c.mask()
            if tok not in c.eos_ids:
                c.advance(tok)
            dt = time.perf_counter() - t
            n, secs, worst = n + 1, secs + dt, max(worst, dt)
    step_ms = 1e3 * sum(p["decode_s"] for p in plain) / max(1, sum(p["n_tokens"] for p in plain))
    per = 1e3 * secs / max(1, n)
    return {"mask_ms_per_token": round(per, 4), "mask_ms_max": round(1e3 * worst, 3), "n_tokens": n,
            "plain_decode_ms_per_token": round(step_ms, 2),
            "share_of_step": round(per / step_ms, 4) if step_ms else None}


# ---- llama.cpp ----------------------------------------------------------------------------------

def run_llama(name: str, exe: Path, rows: list[dict], n_predict: int, log_dir: Path) -> list[dict]:
    import httpx
    from serve import Server, free_port
    from specbench import llama_command
    from specdec.models import hub
    target, draft = (str(hub.resolve(m, download=True, progress=False)) for m in (QWEN_TARGET, QWEN_DRAFT))
    port = free_port()
    method = "llama-speculative" if name == "llama-md" else "llama-plain"
    server = Server(llama_command(method, exe, target, draft, port, 4096), log_dir / f"structured-{name}.log", port)
    out = []
    try:
        server.wait_healthy(600)
        with httpx.Client(timeout=3600) as client:
            body = {"prompt": "warm up", "n_predict": 4, "temperature": 0.0}
            client.post(server.url + "/completion", json=body).raise_for_status()
            for r in rows:
                body = {"prompt": r["llama_prompt"], "json_schema": r["llama_schema"], "n_predict": n_predict,
                        "temperature": 0.0, "seed": 0, "cache_prompt": False}
                t = time.perf_counter()
                res = client.post(server.url + "/completion", json=body)
                wall = time.perf_counter() - t
                res.raise_for_status()
                j = res.json()
                tm = j.get("timings", {})
                n = int(tm.get("predicted_n", 0))
                drafted, accepted = int(tm.get("draft_n", 0)), int(tm.get("draft_n_accepted", 0))
                out.append({"id": r["id"], "kind": r["kind"], "wall_s": wall,
                            "decode_s": tm.get("predicted_ms", 0) / 1e3, "n_tokens": n,
                            "passes": max(1, n - accepted), "drafted": drafted, "accepted": accepted,
                            "stop": "length" if j.get("stop_type") == "limit" else "stop",
                            "text": j.get("content", ""), "valid": valid(r, j.get("content", ""), llama=True)})
    finally:
        server.stop()
    return out


# ---- summary --------------------------------------------------------------------------------------

def summarize(rows: dict[str, list[dict]]) -> dict:
    out = {}
    for name, rs in rows.items():
        n = sum(r["n_tokens"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        dec = sum(r["decode_s"] for r in rs)
        out[name] = {"n": len(rs), "n_tokens": n, "wall_s": round(wall, 3),
                     "wall_tok_s": round(n / wall, 3) if wall else 0.0,
                     "decode_tok_s": round(n / dec, 3) if dec else 0.0,
                     "tokens_per_pass": round(n / max(1, sum(r["passes"] for r in rs)), 3),
                     "acceptance": round(sum(r["accepted"] for r in rs) / max(1, sum(r["drafted"] for r in rs)), 4),
                     "valid": round(sum(r["valid"] for r in rs) / max(1, len(rs)), 4),
                     "n_length": sum(r["stop"] == "length" for r in rs)}
    base = {"plain": out.get("plain"), "llama": out.get("llama-plain")}
    for name, o in out.items():
        b = base["llama" if name.startswith("llama") else "plain"]
        if b and b["wall_tok_s"]:
            o["speedup"] = round(o["wall_tok_s"] / b["wall_tok_s"], 3)
            o["decode_speedup"] = round(o["decode_tok_s"] / b["decode_tok_s"], 3)
        if "plain" in out and not name.startswith("llama"):
            plain = {r["id"]: r["ids"] for r in rows["plain"]}
            same = sum(r["ids"] == plain.get(r["id"]) for r in rows[name])
            o["same_as_plain"] = round(same / max(1, len(rows[name])), 4)
    return out


def markdown(summary: dict, mask: dict) -> str:
    lines = ["| configuration | wall tok/s | speedup | decode tok/s | speedup | tokens/pass | valid | same as plain |",
             "|---|---|---|---|---|---|---|---|"]
    for name, o in summary.items():
        same = f"{o['same_as_plain']:.0%}" if "same_as_plain" in o else "–"
        lines.append(f"| {name} | {o['wall_tok_s']:.2f} | {o.get('speedup', 1.0):.2f}x | {o['decode_tok_s']:.2f} | "
                     f"{o.get('decode_speedup', 1.0):.2f}x | {o['tokens_per_pass']:.2f} | {o['valid']:.0%} | {same} |")
    if mask:
        lines.append(f"\nmask + advance: {mask['mask_ms_per_token']:.3f} ms per token (max {mask['mask_ms_max']:.2f}), "
                     f"{mask['share_of_step']:.2%} of plain's {mask['plain_decode_ms_per_token']:.1f} ms decode step")
    return "\n".join(lines)


def plot(summary: dict, path: Path, cpu: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    names = list(summary)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    colors = ["#888" if n in ("plain", "llama-plain") else ("#c74" if n.startswith("llama") else "#47a") for n in names]
    ax.bar(x - 0.2, [summary[n]["wall_tok_s"] for n in names], 0.4, color=colors,
           label="whole request (prefill included)")
    bars = ax.bar(x + 0.2, [summary[n]["decode_tok_s"] for n in names], 0.4, color=colors, alpha=0.5,
                  label="decode phase")
    for b, n in zip(bars, names):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{summary[n]['tokens_per_pass']:.2f}/pass",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names, rotation=25, ha="right")
    ax.set_ylabel("tokens / s")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"Structured output (JSON schema, tool calls), Qwen2.5-Coder 1.5B + 0.5B, greedy\n{cpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts of each kind")
    ap.add_argument("--n-predict", type=int, default=160)
    ap.add_argument("--configs", default=",".join(SPECDEC + LLAMA))
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    a = ap.parse_args(argv)
    import specdec
    from specdec.api.request import AUTO_DRAFT_QUANT
    from specdec.frontends.bench import llamacpp_build, llamacpp_dir
    from specdec.generation.constraint import compile_constraint
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    a.out.mkdir(parents=True, exist_ok=True)
    target = specdec.load(QWEN_TARGET)
    draft = specdec.load(QWEN_DRAFT, requant=AUTO_DRAFT_QUANT)
    every = load_prompts("structured")
    kinds = sorted({r["kind"] for r in every})
    picked = [r for k in kinds for r in [x for x in every if x["kind"] == k][:a.limit]]
    rows = prepare(target, picked)
    t = time.perf_counter()
    for r in rows:                          # each grammar compiled before any timing (cached per spec)
        compile_constraint(r["spec"], target.tokenizer, target.config.n_vocab)
    if any(c in SPECDEC for c in configs):                                              # kernels compiled
        target.generate(rows[0]["prompt"], 4, constraint=rows[0]["spec"], draft=draft)
    print(f"{len(rows)} prompts; grammars and kernels ready in {time.perf_counter() - t:.1f} s", flush=True)
    results: dict[str, list[dict]] = {}
    mask: dict = {}
    for name in configs:
        t = time.perf_counter()
        if name in SPECDEC:
            results[name] = run_specdec(name, target, draft, rows, a.n_predict)
        else:
            exe = llamacpp_dir() / "bin" / "llama-server"
            if not exe.exists():
                print(f"{name}: skipped (no native llama.cpp build)", flush=True)
                continue
            results[name] = run_llama(name, exe, rows, a.n_predict, a.out)
        print(f"{name}: {len(results[name])} answers in {time.perf_counter() - t:.0f} s", flush=True)
        if name == "plain":
            mask = mask_cost(target, rows, results["plain"])
        write(a, rows, results, mask, llamacpp_build())      # after each: a cut run keeps what it measured
    print(markdown(summarize(results), mask))


def write(a, rows: list[dict], results: dict, mask: dict, build) -> None:
    summary = summarize(results)
    machine = machine_info()
    write_json(a.out / "structured.json", {
        "machine": machine, "llamacpp_build": build, "target": QWEN_TARGET, "draft": QWEN_DRAFT,
        "n_predict": a.n_predict, "prompts": [r["id"] for r in rows], "summary": summary, "mask": mask,
        "rows": {n: [{k: v for k, v in r.items() if k != "ids"} for r in rs] for n, rs in results.items()}})
    plot(summary, a.out / "structured.png", machine.get("cpu", "?"))


if __name__ == "__main__":
    main()
