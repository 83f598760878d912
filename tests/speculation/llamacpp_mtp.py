"""llama.cpp's own MTP draft logits on a file, in process (llama-cpp-python 0.3.36), driven as
common/speculative.cpp's draft-mtp drives it: a target context keeps its unmasked nextn
hidden rows (llama_set_embeddings_nextn), an MTP context (LLAMA_CONTEXT_TYPE_MTP) gets the
context's rows but the last one with the target's h shifted by one (process()), then the
last token alone with the target's last h (draft()), then each drafted token alone with the
MTP's own h of the step before at the next position.

The nextn getters are in llama.cpp's staging header (src/llama-ext.h), exported with C++
linkage only: they are bound here by their mangled names.  `available()` says why not when
they cannot be.
"""
from __future__ import annotations

import ctypes

import numpy as np

_MANGLED = {"set": "_Z26llama_set_embeddings_nextnP13llama_contextbb",
            "get": "_Z26llama_get_embeddings_nextnP13llama_context",
            "get_ith": "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"}


def available() -> str | None:
    """None when llama.cpp's MTP can be driven from here, else why not."""
    try:
        import llama_cpp.llama_cpp as L
    except ImportError as e:
        return f"llama_cpp: {e}"
    if not hasattr(L, "LLAMA_CONTEXT_TYPE_MTP") or not hasattr(L, "llama_batch_ext_init"):
        return "llama_cpp has no MTP context type / llama_batch_ext"
    missing = [n for n in _MANGLED.values() if not hasattr(L._lib, n)]
    return f"libllama lacks {missing}" if missing else None


def _fns(L):
    lib = L._lib
    f = {k: getattr(lib, n) for k, n in _MANGLED.items()}
    f["set"].argtypes, f["set"].restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    f["get"].argtypes, f["get"].restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)
    f["get_ith"].argtypes, f["get_ith"].restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)
    return f


def mtp_draft_logits(path, context, drafted, n_ctx: int = 128) -> np.ndarray:
    """(len(drafted) + 1, V) float32: the MTP logits llama.cpp draws draft i from after
    `context`, the drafted tokens given (test_mtp.py compares them with ours)."""
    import llama_cpp.llama_cpp as L
    f = _fns(L)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    ctxs, keep = [], []
    try:
        for kind in (0, L.LLAMA_CONTEXT_TYPE_MTP):
            cp = L.llama_context_default_params()
            cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
            cp.n_threads = cp.n_threads_batch = 1
            cp.ctx_type = kind
            ctxs.append(L.llama_init_from_model(model, cp))
        tgt, dft = ctxs
        f["set"](tgt, True, False)
        f["set"](dft, True, True)
        D, V = L.llama_model_n_embd(model), L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

        def run(ctx, toks, start, embs, out_last):
            b = L.llama_batch_ext_init(ctx)
            try:
                for j, t in enumerate(toks):
                    i = L.llama_batch_ext_add_token(b, 0, int(t))
                    pos = (L.llama_pos * 4)(start + j, 0, 0, 0)
                    keep.append(pos)
                    L.llama_batch_ext_set_pos(b, i, pos)
                    if embs is not None:
                        row = np.ascontiguousarray(embs[j], np.float32)
                        keep.append(row)
                        L.llama_batch_ext_set_embd_token(
                            b, i, L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, D))
                    L.llama_batch_ext_set_output_logits(b, i, embs is None or (out_last and j == len(toks) - 1))
                if L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, b) != 0:
                    raise RuntimeError("llama_process failed")
            finally:
                L.llama_batch_ext_free(b)

        n = len(context) - 1
        run(tgt, context[:-1], 0, None, False)
        H = np.ctypeslib.as_array(f["get"](tgt), shape=(n * D,)).reshape(n, D).copy()   # (n, D)
        h = np.concatenate([np.zeros((1, D), np.float32), H])                            # h_t = H_{t-1}
        if n:
            run(dft, context[:-1], 0, h[:-1], False)                                     # process()
        rows = []
        for i, tok in enumerate([context[-1], *drafted]):                                # draft()
            run(dft, [tok], n + i, h[-1:], True)
            rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(dft, 0), shape=(V,)).copy())
            h = np.ctypeslib.as_array(f["get_ith"](dft, 0), shape=(D,)).copy()[None]
        return np.stack(rows)
    finally:
        for c in ctxs:
            if c:
                L.llama_free(c)
        L.llama_model_free(model)
