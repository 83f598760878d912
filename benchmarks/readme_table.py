"""Regenerate the speed tables from the benchmark JSON files: docs/speed.md's section per CPU,
and the README's one table per CPU.

Reads bandwidth.json, decode.json, verify_curve.json, speculative.json, drafters.json,
replay.json and memory.json from --results (whichever exist) and rewrites the block between the
`<!-- speed-table -->` and `<!-- /speed-table -->` markers of docs/speed.md, and the README's
`<!-- speed-summary -->` block: the decoding table (`benchmarks/decode.py`) with its
provenance and a link to the rest.  Plots are copied to docs/img/ so that docs/speed.md can
show them.

    python benchmarks/readme_table.py [--results bench-results] [--doc docs/speed.md] [--readme README.md]
    python benchmarks/readme_table.py --results benchmarks/results/amd --block amd
    python benchmarks/readme_table.py --results benchmarks/results/intel --summary-only

--block NAME rewrites the blocks `<!-- speed-table:NAME -->` ... `<!-- /speed-table:NAME -->`
and `<!-- speed-summary:NAME -->` ... instead (one per CPU the figures were measured on), with
its plots under docs/img/NAME/.  --summary-only leaves docs/speed.md alone (its block may
hold tables whose JSON another run made).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- speed-table -->", "<!-- /speed-table -->"
SUMMARY = "speed-summary"
PLOTS = ("decode.png", "verify_curve.png", "speculative.png", "drafters.png", "replay.png")


def _load(results: Path, name: str) -> dict | None:
    p = results / name
    return json.loads(p.read_text()) if p.exists() else None


def decode_table(dec: dict, bw: dict | None) -> list[str]:
    roof = bw["all_threads_gbs"] if bw else None
    out = ["| model | pp64 tok/s | llama.cpp | tg64 tok/s | llama.cpp | ratio | weights GB/s"
           + (" | % of DRAM roofline |" if roof else " |"),
           "| --- | ---: | ---: | ---: | ---: | ---: | ---:" + (" | ---: |" if roof else " |")]
    for r in dec["results"]:
        ratio = f"{r['tg_vs_llamacpp']:.2f}x" if r.get("tg_vs_llamacpp") else "-"
        row = (f"| {r['model']} | {r['pp64_tok_s']:.1f} | {r['llamacpp_pp64_tok_s'] or '-'} | "
               f"{r['tg64_tok_s']:.1f} | {r['llamacpp_tg64_tok_s'] or '-'} | {ratio} | {r['tg_gb_s']:.1f}")
        out.append(row + (f" | {100 * r['tg_gb_s'] / roof:.0f}% |" if roof else " |"))
    return out


def verify_lines(vc: dict) -> list[str]:
    ms = [str(m) for m in vc["ms"]]
    out = ["| model | " + " | ".join(f"M={m}" for m in ms) + " | decode step | Python glue |",
           "| --- | " + " | ".join("---:" for _ in ms) + " | ---: | ---: |"]
    for r in vc["models"]:
        rel = r["curve"]["relative"]
        p = r.get("profile")                                   # absent with --no-profile
        step, glue = (f"{p['step_ms']:.1f} ms", f"{p['python_glue_pct']:.1f}%") if p else ("-", "-")
        out.append(f"| {r['model']} | " + " | ".join(f"{rel[m]:.2f}" for m in ms) + f" | {step} | {glue} |")
        ms_row = r["curve"]["forward_ms"]
        out.append("| &nbsp;&nbsp;ms | " + " | ".join(f"{ms_row[m]:.1f}" for m in ms) + " | | |")
        if "baseline" in r:                                    # --baseline: the tree it replaces, same run
            b = r["baseline"]["curve"]["forward_ms"]
            out.append(f"| &nbsp;&nbsp;{r['baseline']['commit']}, ms | " + " | ".join(f"{b[m]:.1f}" for m in ms)
                       + " | | |")
        if "llamacpp_curve" in r:
            lc = r["llamacpp_curve"]
            out.append("| &nbsp;&nbsp;llama.cpp, relative | " + " | ".join(f"{lc['relative'][m]:.2f}" for m in ms)
                       + " | | |")
            out.append("| &nbsp;&nbsp;llama.cpp, ms | " + " | ".join(f"{lc['forward_ms'][m]:.1f}" for m in ms)
                       + " | | |")
    return out + pp_lines(vc)


def pp_lines(vc: dict) -> list[str]:
    """Prompt processing per model and kernel path, beside the baseline tree and llama-bench."""
    pps = [str(n) for n in vc.get("pp", [])]
    if not pps:
        return []
    out = ["", "| model | path | " + " | ".join(f"pp{n} tok/s" for n in pps) + " | "
           + " | ".join(f"vs llama.cpp pp{n}" for n in pps) + " |",
           "| --- | --- | " + " | ".join("---:" for _ in pps * 2) + " |"]
    for r in vc["models"]:
        lc = r.get("llamacpp_curve", {}).get("pp_tok_s", {})
        rows = [(p, sec["pp_tok_s"]) for p, sec in r.get("paths", {}).items()]
        if "baseline" in r:
            rows.append((r["baseline"]["commit"], r["baseline"]["pp_tok_s"]))
        if lc:
            rows.append(("llama.cpp", lc))
        for name, pp in rows:
            ratio = [f"{pp[n] / lc[n]:.2f}x" if lc.get(n) else "-" for n in pps]
            out.append(f"| {r['model']} | {name} | " + " | ".join(f"{pp[n]:.1f}" for n in pps) + " | "
                       + " | ".join(ratio) + " |")
    return out


def speculative_lines(sp: dict) -> list[str]:
    out = ["| temperature | plain tok/s | best setting | speculative tok/s | speedup | acceptance | tokens/step |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for t, r in sp["by_temperature"].items():
        b = r["best"]
        out.append(f"| {t} | {r['plain_tok_s']:.2f} | draft-n {b['draft_n']}, draft-p {b['draft_p']:g} | "
                   f"{b['tok_s']:.2f} | {b['speedup']:.2f}x | {b['acceptance']:.2f} | {b['tokens_per_step']:.2f} |")
    c = sp["costs"]
    out.append("")
    out.append(f"Measured costs: one draft token = {c['draft_cost_ratio']:.2f} of a target token; "
               "verifying n drafted tokens costs " + ", ".join(
                   f"{v:.2f}x" for v in list(c["verify_growth"].values())[:6])
               + f" of one target token for n = {', '.join(list(c['verify_growth'])[:6])}.")
    return out


def drafters_lines(dr: dict) -> list[str]:
    configs = [c for c in ("plain", "model", "prompt-lookup", "lookup-adaptive", "hybrid", "adaptive",
                                   "suffix", "suffix-adaptive")
               if c in next(iter(dr["results"].values()))["summary"]]
    out = ["| prompt set | " + " | ".join(configs) + " |",
           "| --- | " + " | ".join("---:" for _ in configs) + " |"]
    for s, r in dr["results"].items():
        summ = r["summary"]
        out.append(f"| {s} | " + " | ".join(
            f"{summ[c]['tok_s']:.1f} tok/s ({summ[c]['speedup']:.2f}x)" for c in configs) + " |")
    out += ["", "Per prompt, speedup over plain (same run):", "",
            "| prompt | tokens | " + " | ".join(configs[1:]) + " |",
            "| --- | ---: | " + " | ".join("---:" for _ in configs[1:]) + " |"]
    for s, r in dr["results"].items():
        runs = r["runs"]
        for i, pid in enumerate(r["prompts"]):
            base = runs["plain"][i]["decode_s"]
            out.append(f"| {s}/{pid} | {runs['plain'][i]['n_tokens']} | " + " | ".join(
                f"{base / runs[c][i]['decode_s']:.2f}" for c in configs[1:]) + " |")
    return out


def replay_lines(rp: dict) -> list[str]:
    configs = [c for c in ("model", "prompt-lookup", "hybrid", "lookup-perfect", "hybrid-perfect",
                           "any-match", "oracle-copy") if c in next(iter(rp["results"].values()))["replayed"]]
    out = ["| prompt set | | " + " | ".join(configs) + " |",
           "| --- | --- | " + " | ".join("---:" for _ in configs) + " |"]
    for s, r in rp["results"].items():
        out.append(f"| {s} | replayed | " + " | ".join(f"{r['replayed'][c]:.2f}" for c in configs) + " |")
        out.append("| | measured | " + " | ".join(
            f"{r['measured'][c]:.2f}" if c in r["measured"] else "" for c in configs) + " |")
    goal, scales, grid = rp["goal"], rp["what_if"]["scales"], rp["what_if"]["best_speedup"]
    for s, g in grid.items():
        hits = [(sv, sd) for sv in scales for sd in scales if g[f"{sv}/{sd}"] >= goal]
        cheapest = max(hits, key=lambda h: h[0] * h[1], default=None)
        out += ["", f"What if ({s}): the best of lookup and hybrid reaches {goal}x "
                + (f"when a verification row costs {cheapest[0]}x and a draft pass {cheapest[1]}x "
                   f"what they cost here, or less (the least reduction on the grid "
                   f"{', '.join(map(str, scales))} that does)"
                   if cheapest else f"nowhere on the grid (rows and draft passes down to "
                   f"{min(scales)}x their measured cost): best {max(g.values()):.2f}x")
                + "."]
    return out


def defaults_lines(df: dict) -> list[str]:
    """The sets of benchmarks/defaults.py: plain vs the defaults vs llama.cpp's flags."""
    cfgs = [c for c in df["configs"] if c != "plain"]
    out = ["| prompt set | plain tok/s | " + " | ".join(f"{c} tok/s (speedup, lowest prompt)" for c in cfgs) + " |",
           "| --- | ---: | " + " | ".join("---:" for _ in cfgs) + " |"]
    for name, r in df["summary"].items():
        cells = [f"{r[c]['tok_s']:.1f} ({r[c]['speedup']:.2f}x, {r[c]['min_speedup']:.2f}x)" for c in cfgs]
        out.append(f"| {name} | {r['plain']['tok_s']:.1f} | " + " | ".join(cells) + " |")
    return out


def _when(d: dict, date: str) -> str:
    """' (run of DATE)' when a result file comes from another run than the header's."""
    return "" if d["machine"]["date"] == date else f" (run of {d['machine']['date']})"


def build(results: Path, img: str = "img", links: str = "") -> str:
    """docs/speed.md's block; img and links relative to the file that holds it."""
    bw, dec = _load(results, "bandwidth.json"), _load(results, "decode.json")
    vc, sp = _load(results, "verify_curve.json"), _load(results, "speculative.json")
    dr, mem = _load(results, "drafters.json"), _load(results, "memory.json")
    rp, df = _load(results, "replay.json"), _load(results, "defaults.json")
    first = next((d for d in (dec, vc, sp, dr) if d), None)
    if first is None:
        raise SystemExit(f"{results}: no benchmark results (run the benchmarks first)")
    m = first["machine"]
    live = next((r["llamacpp_source"] for r in (dec or {}).get("results", [])
                 if (r.get("llamacpp_source") or "").startswith(("measured", "llama-bench"))), None)
    build_ = m.get("llama_cpp_build") or {}
    if build_:
        opts = " ".join(o for o in build_.get("cmake_options", []) if "NATIVE" in o or "AMX" in o)
        llama = (f"llama.cpp's figures were measured in the same run on the same files and threads "
                 f"(llama-bench of llama-cpp-python {build_.get('llama_cpp_python')}'s llama.cpp "
                 f"{build_.get('llama_cpp_commit')}, built on this host with `{opts}`"
                 + (", AMX off" if not build_.get("amx_compiled") else "") + ")")
    elif live:
        llama = (f"llama.cpp's figures were measured in the same run on the same files and threads "
                 f"({live.split('(')[-1].rstrip(')')}, built without AMX)")
    else:
        llama = "llama.cpp's figures are llama-bench on the same machine kind (`-t 2 -p 64 -n 64`)"
    mapped = all(r.get("mmap", True) for r in (dec or {}).get("results", []))
    kp = m.get("kernel_paths") or {}
    cpu = m["cpu"] + (f" ({m['cpu_microarchitecture']})" if m.get("cpu_microarchitecture") else "")
    fr = (bw or {}).get("file_read")
    if mapped:
        load = ""
    elif fr:
        load = (f" Both engines read the weights into process memory (specdec's default load where "
                f"the file fits; llama.cpp `-lm none`); reading {fr['file']} here ran at "
                f"{fr['mapped_gbs']:.1f} GB/s mapped, {fr['in_memory_gbs']:.1f} GB/s in memory "
                f"and {fr['in_memory_hugepages_gbs']:.1f} GB/s in huge pages.")
    else:
        load = (" Both engines read the weights into memory (`--no-mmap`): on this VM, reading "
                "mapped page-cache pages runs at about 15 GB/s against 26 GB/s for process memory.")
    lines = [f"Measured {m['date']} on {cpu}, {m['cores']} cores, Numba {m['numba']}"
             + (f", kernel paths: K-quants {kp['kquants']}, legacy {kp['legacy']}" if kp else "")
             + f", with the commands of [docs/reproduce.md]({links}reproduce.md); {llama}. The machine is "
             "shared: absolute figures move by up to 2x with the neighbours' load, ratios measured "
             "side by side far less." + load]
    date = m["date"]
    if bw:
        lines += ["", f"Memory read bandwidth: {bw['single_thread_gbs']:.1f} GB/s on one thread, "
                      f"{bw['all_threads_gbs']:.1f} GB/s on {bw['threads']} (`benchmarks/bandwidth.py`)."]
    if dec:
        lines += ["", "**Decoding, one model** (`benchmarks/decode.py`; best of 3; "
                      "`:q8` = `activations=\"q8\"`):", ""] + decode_table(dec, bw)
    if vc:
        lines += ["", "**What verification costs**: one target forward over M tokens, relative to "
                      f"M = 1 (`benchmarks/verify_curve.py`){_when(vc, date)}:", ""] + verify_lines(vc)
    if sp:
        n = len(sp["prompts"])
        lines += ["", f"**Speculative decoding**, {sp['target']} with {sp['draft']}, "
                      f"{sp['settings']['n_predict']} tokens, {n} code-writing chat prompt{'s' * (n > 1)}, "
                      f"best of the draft-n × draft-p sweep (`benchmarks/speculative.py`){_when(sp, date)}:",
                  ""] \
            + speculative_lines(sp)
    if dr:
        dv = dr["settings"].get("draft_vocab")
        lines += ["", f"**Drafters**, greedy, draft-n {dr['settings']['draft_n']}, "
                      + (f"draft model with `--draft-vocab {dv}`, " if dv else "") +
                      f"{dr['settings']['prompts']} prompts per set, every answer to its end "
                      f"(cap {dr['settings']['n_predict']} tokens), tok/s (speedup over plain, same run; "
                      f"`benchmarks/drafters.py`){_when(dr, date)}:", ""] + drafters_lines(dr)
    if df:
        lines += ["", f"**The defaults** (`generate(draft=draft_model)`: `specdec run -md DRAFT` "
                      f"with no drafting flags, but with the draft as stored; the CLI also "
                      f"requantizes its layers to Q4_0), {df['target']} with {df['draft']}, greedy, "
                      f"prompt + {df['n_predict']} tokens timed from the call (prefill included), "
                      f"against llama.cpp's flags `--draft-n 5 --draft-p 0.9` "
                      f"(`benchmarks/defaults.py`){_when(df, date)}:", ""] + defaults_lines(df)
    if rp:
        lines += ["", f"**Replay of those answers** at forward costs measured alongside "
                      f"(context {rp['context']}: target {rp['target_ms']['1']:.1f} ms for one row, "
                      f"{rp['target_ms']['9']:.1f} for 9, draft {rp['draft_ms']['1']:.1f}; speedup over "
                      f"plain; `benchmarks/replay.py`, which explains the bounds){_when(rp, date)}:",
                  ""] + replay_lines(rp)
    if mem:
        lines += ["", f"**Memory**{_when(mem, date)}: both Qwen models with a {mem['ctx_size']}-token context peak at "
                      f"{mem['peak_rss_bytes'] / 2**20:.0f} MiB resident, "
                      f"{mem['ratio_to_files_plus_kv']:.2f}x the GGUF files plus KV caches "
                      + ("(the weights memory-mapped)." if mapped else "(the weights read into memory).")]
    plots = [p for p in PLOTS if (results / p).exists()]
    if plots:
        lines += [""] + [f"![{p[:-4]}]({img}/{p})" for p in plots]
    return "\n".join(lines)


def summary(results: Path, anchor: str) -> str:
    """The README's table for one CPU: decode.json's table, where it comes from, and a link."""
    dec, bw = _load(results, "decode.json"), _load(results, "bandwidth.json")
    if dec is None:
        raise SystemExit(f"{results}: no decode.json (run benchmarks/decode.py first)")
    m = dec["machine"]
    cpu = m["cpu"] + (f" ({m['cpu_microarchitecture']})" if m.get("cpu_microarchitecture") else "")
    rel = results.resolve().relative_to(ROOT) if results.resolve().is_relative_to(ROOT) else results
    return "\n".join([f"Decoding one model, specdec beside llama.cpp built natively in the same run "
                      f"({m['date']}, {cpu}, {m['cores']} cores; `benchmarks/decode.py`, best of 3, "
                      f"{rel}/decode.json; every other table: [docs/speed.md](docs/speed.md#{anchor})):",
                      ""] + decode_table(dec, bw))


def _replace(path: Path, name: str | None, kind: str, block: str) -> None:
    begin, end = (f"<!-- {kind} -->", f"<!-- /{kind} -->") if name is None else \
        (f"<!-- {kind}:{name} -->", f"<!-- /{kind}:{name} -->")
    text = path.read_text(encoding="utf-8")
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"{path}: no {begin} ... {end} block")
    path.write_text(text[:i + len(begin)] + "\n" + block + "\n" + text[j:], encoding="utf-8")
    print(f"{path}: {kind} block rewritten")


def _anchor(doc: Path, name: str | None) -> str:
    """The GitHub anchor of the heading above the block in docs/speed.md."""
    text = doc.read_text(encoding="utf-8")
    marker = "<!-- speed-table -->" if name is None else f"<!-- speed-table:{name} -->"
    head = [ln for ln in text[:max(text.find(marker), 0)].splitlines() if ln.startswith("#")]
    title = head[-1].lstrip("#").strip().lower() if head else ""
    return "".join(c for c in title.replace(" ", "-") if c.isalnum() or c in "-_")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "bench-results"))
    ap.add_argument("--doc", default=str(ROOT / "docs" / "speed.md"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--block", default=None, help="the named blocks (one per CPU) instead of the first")
    ap.add_argument("--summary-only", action="store_true", help="the README's table only")
    a = ap.parse_args(argv)
    results, doc = Path(a.results), Path(a.doc)
    img = "img" if a.block is None else f"img/{a.block}"
    if not a.summary_only:
        block = build(results, img)
        (doc.parent / img).mkdir(parents=True, exist_ok=True)
        for p in PLOTS:
            if (results / p).exists():
                shutil.copyfile(results / p, doc.parent / img / p)
        _replace(doc, a.block, "speed-table", block)
    _replace(Path(a.readme), a.block, SUMMARY, summary(results, _anchor(doc, a.block)))


if __name__ == "__main__":
    main()
