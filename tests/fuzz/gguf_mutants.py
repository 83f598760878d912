"""Structured mutations of GGUF files: the fuzzer's input side (no specdec imports).

`scan(buf)` finds where every field of a GGUF header lies (it trusts nothing but the bytes of
the unmutated file); `mutants(base, layout, rng, n)` draws n mutants, each a (kind, detail,
bytes) triple, from these families:

    truncate_boundary  cut at a section boundary (header, each KV, each tensor info, data) +-3
    truncate_random    cut at a random offset
    flip_<section>     XOR 1-4 random bytes of header / kv / tinfo / data
    lie_count          n_tensors or n_kv replaced by an interesting value
    lie_strlen         a key / tensor name / string value length field replaced
    lie_arrlen         an array length field replaced
    lie_dims           a tensor dim (or n_dims) replaced
    lie_type           a KV value type, array element type or ggml tensor type replaced
    lie_offset         a tensor data offset replaced (unaligned, past the end, huge)
    set_kv             a metadata key re-encoded with another type or value (alignment,
                       hyper-parameters, tokenizer arrays): 0, -1, huge, NaN, strings, lists
    dup_kv / dup_tensor / drop_kv   a KV or tensor info duplicated or dropped
Header edits that change the header's length are re-padded so tensor offsets stay valid.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

STRING, ARRAY = 8, 9
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
              11: "<q", 12: "<d"}
INTERESTING = (0, 1, 2, 3, 7, 31, 32, 33, 255, 4096, 65535, 1 << 20, (1 << 31) - 1, 1 << 31, 1 << 32,
               1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)


@dataclass
class KV:
    start: int          # the key's length field
    key: str
    type_pos: int       # the u32 value type
    end: int
    strlens: list[int] = field(default_factory=list)   # positions of string length fields (u64)
    arrays: list[int] = field(default_factory=list)    # positions of array (etype u32, n u64) pairs


@dataclass
class TInfo:
    start: int
    name: str
    ndims_pos: int
    dims_pos: list[int]
    type_pos: int
    off_pos: int
    end: int


@dataclass
class Layout:
    n_tensors: int
    n_kv: int
    kvs: list[KV]
    tinfos: list[TInfo]
    header_end: int      # end of the tensor infos
    data_start: int
    alignment: int
    size: int

    def boundaries(self) -> list[int]:
        out = [0, 4, 8, 16, 24, self.header_end, self.data_start, self.size]
        out += [kv.start for kv in self.kvs] + [kv.type_pos for kv in self.kvs]
        out += [t.start for t in self.tinfos] + [t.off_pos for t in self.tinfos]
        return sorted(set(out))


def scan(buf: bytes) -> Layout:
    """Field positions of a well-formed GGUF v3 file (raises on anything else)."""
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)

    def u32():
        nonlocal pos
        pos += 4
        return struct.unpack_from("<I", buf, pos - 4)[0]

    def string(lens):
        nonlocal pos
        lens.append(pos)
        n = struct.unpack_from("<Q", buf, pos)[0]
        pos += 8 + n
        return bytes(buf[pos - n:pos]).decode("utf-8", "replace")

    def value(vtype, kv, scalars):
        nonlocal pos
        if vtype == STRING:
            scalars.append(string(kv.strlens))
        elif vtype == ARRAY:
            kv.arrays.append(pos)
            etype = u32()
            n = struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
            if etype in SCALAR_SIZE:
                scalars.extend(struct.unpack_from(f"<{n}{SCALAR_FMT[etype][1]}", buf, pos))
                pos += n * SCALAR_SIZE[etype]
            else:
                for _ in range(n):
                    value(etype, kv, scalars)
        else:
            scalars.append(struct.unpack_from(SCALAR_FMT[vtype], buf, pos)[0])
            pos += SCALAR_SIZE[vtype]

    kvs, meta = [], {}
    for _ in range(n_kv):
        start = pos
        kv = KV(start, "", 0, 0)
        kv.key = string([])
        kv.type_pos = pos
        vals: list = []
        value(u32(), kv, vals)
        kv.end = pos
        kvs.append(kv)
        meta[kv.key] = vals
    tinfos = []
    for _ in range(n_tensors):
        start = pos
        name = string([])
        ndims_pos = pos
        nd = u32()
        dims_pos = [pos + 8 * i for i in range(nd)]
        pos += 8 * nd
        type_pos = pos
        pos += 4
        off_pos = pos
        pos += 8
        tinfos.append(TInfo(start, name, ndims_pos, dims_pos, type_pos, off_pos, pos))
    align = int(meta.get("general.alignment", [32])[0])
    data_start = -(-pos // align) * align
    return Layout(n_tensors, n_kv, kvs, tinfos, pos, data_start, align, len(buf))


def encode_kv(key: str, vtype: int, value, etype: int | None = None) -> bytes:
    """One KV pair's bytes: key, type, value (for ARRAY: etype and a list)."""
    def enc(t, v):
        if t == STRING:
            b = str(v).encode()
            return struct.pack("<Q", len(b)) + b
        return struct.pack(SCALAR_FMT[t], v)
    k = key.encode()
    out = struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype)
    if vtype == ARRAY:
        return out + struct.pack("<IQ", etype, len(value)) + b"".join(enc(etype, v) for v in value)
    return out + enc(vtype, value)


def rebuild(buf: bytes, lay: Layout, kv_chunks: list[bytes], ti_chunks: list[bytes]) -> bytes:
    """A file with these KV and tensor-info byte chunks and the original data section."""
    head = buf[:8] + struct.pack("<QQ", len(ti_chunks), len(kv_chunks)) + b"".join(kv_chunks) + b"".join(ti_chunks)
    pad = -len(head) % lay.alignment
    return head + b"\0" * pad + buf[lay.data_start:]


def _chunks(buf, lay):
    return ([buf[k.start:k.end] for k in lay.kvs], [buf[t.start:t.end] for t in lay.tinfos])


def _put(buf: bytes, pos: int, fmt: str, value: int) -> bytes:
    size = struct.calcsize(fmt)
    return buf[:pos] + struct.pack(fmt, value % (1 << (8 * size))) + buf[pos + size:]


def _interesting(rng, around: int | None = None) -> int:
    if around is not None and rng.random() < 0.4:
        return max(0, around + int(rng.integers(-3, 4)))
    return int(INTERESTING[rng.integers(len(INTERESTING))])


def _flip(buf: bytes, lo: int, hi: int, rng) -> tuple[str, bytes]:
    b = bytearray(buf)
    hi = max(hi, lo + 1)
    spots = rng.integers(lo, min(hi, len(b)), size=int(rng.integers(1, 5)))
    for p in spots:
        b[p] ^= int(rng.integers(1, 256))
    return f"bytes {sorted(int(p) for p in spots)}", bytes(b)


# values set_kv tries: (vtype, value, etype)
_ODD_VALUES = [(4, 0, None), (5, -1, None), (10, (1 << 64) - 1, None), (11, -(1 << 62), None),
               (6, float("nan"), None), (6, float("inf"), None), (12, -1e300, None), (6, 1e30, None),
               (7, True, None), (STRING, "abc", None), (STRING, "", None), (ARRAY, [1, 2, 3], 4),
               (ARRAY, ["x"] * 3, STRING), (ARRAY, [], 5), (4, 3, None), (4, 1 << 31, None)]
_KEYS_OF_INTEREST = ("general.alignment", "general.architecture", ".block_count", ".embedding_length",
                     ".attention.head_count", ".attention.head_count_kv", ".feed_forward_length",
                     ".context_length", ".rope.dimension_count", ".rope.freq_base",
                     ".attention.layer_norm_rms_epsilon", ".attention.key_length", ".attention.sliding_window",
                     "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                     "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.model",
                     "tokenizer.ggml.pre", "tokenizer.ggml.scores", "tokenizer.chat_template",
                     "tokenizer.ggml.add_bos_token")


def mutate(buf: bytes, lay: Layout, kind: str, rng: np.random.Generator) -> tuple[str, bytes]:
    """One mutant of kind `kind`: (a description that, with the kind, says what changed, bytes)."""
    kvs, tis = lay.kvs, lay.tinfos
    if kind == "truncate_boundary":
        cut = int(rng.choice(lay.boundaries())) + int(rng.integers(-3, 4))
        cut = min(max(cut, 0), lay.size - 1)
        return f"cut at {cut}", buf[:cut]
    if kind == "truncate_random":
        cut = int(rng.integers(0, lay.size))
        return f"cut at {cut}", buf[:cut]
    if kind.startswith("flip_"):
        lo, hi = {"flip_header": (0, 24), "flip_kv": (24, kvs[-1].end if kvs else 25),
                  "flip_tinfo": (tis[0].start if tis else 24, lay.header_end),
                  "flip_data": (lay.data_start, lay.size)}[kind]
        return _flip(buf, lo, hi, rng)
    if kind == "lie_count":
        pos, n = (8, lay.n_tensors) if rng.random() < 0.5 else (16, lay.n_kv)
        v = _interesting(rng, n)
        return f"{'n_tensors' if pos == 8 else 'n_kv'} = {v}", _put(buf, pos, "<Q", v)
    if kind == "lie_strlen":
        pick = rng.integers(3)
        if pick == 0 or not any(k.strlens for k in kvs):
            pos = kvs[rng.integers(len(kvs))].start if pick != 2 else tis[rng.integers(len(tis))].start
        else:
            lens = [p for k in kvs for p in k.strlens]
            pos = lens[rng.integers(len(lens))]
        old = struct.unpack_from("<Q", buf, pos)[0]
        v = _interesting(rng, old)
        return f"string length at {pos}: {old} -> {v}", _put(buf, pos, "<Q", v)
    if kind == "lie_arrlen":
        arrs = [p for k in kvs for p in k.arrays]
        pos = arrs[rng.integers(len(arrs))] + 4
        old = struct.unpack_from("<Q", buf, pos)[0]
        v = _interesting(rng, old)
        return f"array length at {pos}: {old} -> {v}", _put(buf, pos, "<Q", v)
    if kind == "lie_dims":
        t = tis[rng.integers(len(tis))]
        if rng.random() < 0.25:
            v = int(rng.choice([0, 2, 3, 4, 5, 1 << 31]))
            return f"{t.name} n_dims -> {v}", _put(buf, t.ndims_pos, "<I", v)
        i = int(rng.integers(len(t.dims_pos)))
        old = struct.unpack_from("<Q", buf, t.dims_pos[i])[0]
        v = int(rng.choice([old * 2, old + 1, old // 2, old * 32])) if rng.random() < 0.5 else _interesting(rng)
        return f"{t.name} dim {i}: {old} -> {v}", _put(buf, t.dims_pos[i], "<Q", v)
    if kind == "lie_type":
        r = rng.random()
        if r < 0.4:
            t = tis[rng.integers(len(tis))]
            v = int(rng.choice([0, 1, 2, 3, 6, 8, 9, 10, 12, 14, 16, 20, 30, 39, 40, 41, 99, 1 << 31]))
            return f"{t.name} ggml type -> {v}", _put(buf, t.type_pos, "<I", v)
        k = kvs[rng.integers(len(kvs))]
        pos = k.arrays[0] if r < 0.6 and k.arrays else k.type_pos
        v = int(rng.choice([*range(14), 99, 1 << 31]))
        return f"{k.key} {'element ' if pos != k.type_pos else ''}type -> {v}", _put(buf, pos, "<I", v)
    if kind == "lie_offset":
        t = tis[rng.integers(len(tis))]
        old = struct.unpack_from("<Q", buf, t.off_pos)[0]
        v = int(rng.choice([old + 1, old + lay.alignment, old - lay.alignment, lay.size, lay.size - lay.data_start,
                            0, 1 << 40, (1 << 64) - lay.alignment]))
        return f"{t.name} offset {old} -> {v}", _put(buf, t.off_pos, "<Q", v)
    kc, tc = _chunks(buf, lay)
    if kind == "set_kv":
        arch = next((k for k in kvs if k.key == "general.architecture"), None)
        prefix = ""
        if arch is not None:
            n = struct.unpack_from("<Q", buf, arch.type_pos + 4)[0]
            prefix = bytes(buf[arch.type_pos + 12:arch.type_pos + 12 + n]).decode(errors="replace")
        names = [k.key for k in kvs]
        want = _KEYS_OF_INTEREST[rng.integers(len(_KEYS_OF_INTEREST))]
        hits = [i for i, n in enumerate(names) if n.endswith(want)]
        vtype, value, etype = _ODD_VALUES[rng.integers(len(_ODD_VALUES))]
        if want == "general.alignment" and rng.random() < 0.5:
            vtype, value, etype = 4, int(rng.choice([0, 1, 3, 16, 48, 64, 1 << 31])), None
        chunk = encode_kv(names[hits[0]] if hits else (want if not want.startswith(".") else prefix + want),
                          vtype, value, etype)
        if hits:
            kc[hits[0]] = chunk
        else:
            kc.append(chunk)
        return f"{want} := {value!r:.40} (type {vtype})", rebuild(buf, lay, kc, tc)
    if kind == "dup_kv":
        i = int(rng.integers(len(kc)))
        kc.insert(int(rng.integers(len(kc) + 1)), kc[i])
        return f"duplicate {kvs[i].key}", rebuild(buf, lay, kc, tc)
    if kind == "dup_tensor":
        i = int(rng.integers(len(tc)))
        tc.insert(int(rng.integers(len(tc) + 1)), tc[i])
        return f"duplicate {tis[i].name}", rebuild(buf, lay, kc, tc)
    if kind == "drop_kv":
        i = int(rng.integers(len(kc)))
        del kc[i]
        return f"drop {kvs[i].key}", rebuild(buf, lay, kc, tc)
    raise ValueError(kind)


KINDS = ("truncate_boundary", "truncate_random", "flip_header", "flip_kv", "flip_tinfo", "flip_data",
         "lie_count", "lie_strlen", "lie_arrlen", "lie_dims", "lie_type", "lie_offset", "set_kv",
         "dup_kv", "dup_tensor", "drop_kv")
HEADER_KINDS = tuple(k for k in KINDS if k != "flip_data")   # for files whose data is cut short


def mutants(buf: bytes, lay: Layout, rng: np.random.Generator, n: int, kinds=KINDS):
    """n mutants (kind, detail, bytes), kinds drawn round-robin so every family is tried."""
    for i in range(n):
        kind = kinds[i % len(kinds)]
        detail, out = mutate(buf, lay, kind, rng)
        yield kind, detail, out
