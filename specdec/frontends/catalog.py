"""`specdec info`, `specdec pull`, `specdec models`: what a GGUF file holds, fetching a known
model, and what is known and cached."""
from __future__ import annotations

from collections import Counter

from ..engine import prepared
from ..models import hub


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
    print(f"runtime:       {_runtime()}")
    print(f"tokenizer:     {tok.vocab_type} ({gf.get('tokenizer.ggml.model')}, pre {tok.pre!r}), "
          f"{tok.n_vocab} tokens, BOS {tok.bos_id} (add: {tok.add_bos}), EOS {tok.eos_id}")
    print("tensor types:")
    for name, nbytes in by_type.most_common():
        print(f"  {name:6s} {count[name]:5d} tensors {nbytes / 1e6:10.1f} MB")
    return 0


def _runtime() -> str:
    """The parallel runtime in one line: Numba's threading layer and how threads are chosen."""
    import numba
    from ..engine.thread_count import describe
    from ..kernels import threading_layer
    layer = threading_layer.describe()
    note = f" ({layer['threading_note']})" if "threading_note" in layer else ""
    mode = describe()["threads_mode"]                   # 'all threads' | 'adaptive' | 'fixed N'
    count = {"all threads": "every pass on all", "adaptive": "chosen per pass, up to"}.get(mode, mode + " of")
    return (f"threading layer {layer['threading_asked']}{note}; threads: {count} "
            f"{numba.config.NUMBA_NUM_THREADS} (-t N fixes them; SPECDEC_THREADING picks the layer)")


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
