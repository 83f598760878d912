"""GGUF reader: metadata parsed once, tensors as views of the file, mapped or read into memory.

With ``mmap=True`` the tensors are zero-copy views of a memory map of the file; with
``mmap=False`` the file is read once into process memory (llama.cpp's
``--no-mmap``; memory advised for transparent huge pages) and the tensors are views of that
copy: weights stay quantized either way.  ``mmap=None`` (what `specdec.load` passes by
default) reads the file when it takes at most half of the available memory (`should_map`).
Why offer it: reading mapped page-cache pages can be much slower than reading anonymous
memory on some hosts (docs/architecture.md, "Mapped or in memory", has the figures), and
it is the host, not the file, that decides.

A split model (llama.cpp's gguf-split: `NAME-00001-of-0000N.gguf`, `split.count` in the first
file's metadata) is opened by its first file and read whole: the other files beside it are
mapped and their tensors joined (`GGUFFile._join`).

The file layout (GGUF v2/v3, little endian):

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x (key: str, type: u32, value)
    n_tensors x (name: str, n_dims: u32, dims: u64[n_dims], ggml_type: u32, offset: u64)
    padding to `general.alignment` (default 32)
    tensor data; each tensor at data_start + offset

Why not ``gguf.GGUFReader``: it builds a numpy view for every element of every array field,
which takes ~10 s on a 151,936-token vocabulary.  Here numeric arrays are one
``np.frombuffer`` each and string arrays one pass over the bytes (~0.1 s).  The value-type and
quant-type constants, and the block sizes, come from the ``gguf`` package.
"""
from __future__ import annotations

import mmap as _mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import GGUFError
from . import resources
from .resources import check_fits

GGUF_MAGIC = b"GGUF"
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)   # llama.cpp's gguf-split names
MAX_ARRAY_DEPTH = 8          # arrays of arrays of ...: no real file nests more than twice

_SCALAR = {  # value type -> (struct format, numpy dtype)
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.BOOL: ("<?", np.bool_),
    GGUFValueType.UINT64: ("<Q", np.uint64), GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT64: ("<d", np.float64),
}


def read_into_memory(path: str, on_window=None, window: int = 64 << 20) -> np.ndarray:
    """(file_size,) uint8, read-only: the whole file in anonymous process memory, advised
    for transparent huge pages (MADV_HUGEPAGE, where the kernel has it) so that streaming the
    weights walks 2 MiB pages instead of 4 KiB ones.  on_window(view) is called with each
    `window` bytes (the last part shorter) as soon as they are read (a checksum can run
    beside the reading)."""
    size = os.path.getsize(path)
    try:
        buf = _mmap.mmap(-1, max(size, 1), flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
    except (OSError, MemoryError, OverflowError):
        raise GGUFError(f"{path}: not enough memory to read the file (try --mmap)") from None
    if hasattr(buf, "madvise") and hasattr(_mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(_mmap.MADV_HUGEPAGE)
        except OSError:
            pass                                    # no THP here: ordinary pages
    view, done, sent = memoryview(buf), 0, 0
    try:
        with open(path, "rb", buffering=0) as f:
            while done < size:
                n = f.readinto(view[done: done + window])
                if not n:
                    raise GGUFError(f"{path}: file shrank while being read")
                done += n
                while on_window is not None and sent < done and (done - sent >= window or done == size):
                    on_window(view[sent: min(sent + window, done)])
                    sent = min(sent + window, done)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror or e})") from None
    finally:
        view.release()
    data = np.frombuffer(buf, dtype=np.uint8, count=size)
    data.setflags(write=False)
    return data


def should_map(file_size: int, available: int | None) -> bool:
    """The default load (mmap=None): read the file into memory when it takes at most half of
    the memory available now, map it otherwise (and where that is unknown).  On the machines measured, decoding from
    process memory is faster than from mapped page-cache pages (docs/architecture.md, "Mapped
    or in memory"), and only an in-memory copy can hold the repacked legacy-quant layers."""
    return available is None or file_size > available // 2


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.  ``shape`` is numpy order (rows last-dim-first reversed):
    a GGUF tensor with dims (K, N) is a matrix of N rows of K values -> shape (N, K)."""
    name: str
    ggml_type: int
    dims: tuple[int, ...]      # GGUF order: dims[0] is the contiguous (row) length
    offset: int                # absolute byte offset in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.dims))


_U64 = struct.Struct("<Q")


class _Cursor:
    """Sequential little-endian reads over a bytes-like buffer; short reads are GGUFError."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated GGUF header (needed {n} bytes at offset {self.pos})")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > len(self.buf) - self.pos:
            raise GGUFError(f"{self.path}: corrupt string length {n} at offset {self.pos - 8} "
                            f"(the file has {len(self.buf) - self.pos} bytes left)")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def strings(self, n: int) -> list[str]:
        """n consecutive strings (a string array's elements: a vocabulary's 150k tokens), with
        string()'s checks and messages in one loop over local names."""
        buf, pos, size, out = self.buf, self.pos, len(self.buf), []
        unpack, append = _U64.unpack_from, out.append
        for _ in range(n):
            if pos + 8 > size:
                self.pos = pos
                raise GGUFError(f"{self.path}: truncated GGUF header (needed 8 bytes at offset {pos})")
            k = unpack(buf, pos)[0]
            pos += 8
            if k > size - pos:
                raise GGUFError(f"{self.path}: corrupt string length {k} at offset {pos - 8} "
                                f"(the file has {size - pos} bytes left)")
            append(str(buf[pos:pos + k], "utf-8", "replace"))
            pos += k
        self.pos = pos
        return out

    def value(self, vtype: int, depth: int = 0):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            return self.array(depth)
        if vtype not in _SCALAR:
            raise GGUFError(f"{self.path}: unknown metadata value type {vtype} at offset {self.pos - 4}")
        v = self.scalar(_SCALAR[vtype][0])
        return bool(v) if vtype == GGUFValueType.BOOL else v

    def array(self, depth: int = 0) -> list:
        """An array value; its length is checked against the bytes left before anything is
        built (each element takes at least min_size bytes), nesting against MAX_ARRAY_DEPTH."""
        at = self.pos
        etype, n = self.scalar("<I"), self.scalar("<Q")
        if depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(f"{self.path}: arrays nested deeper than {MAX_ARRAY_DEPTH} at offset {at}")
        if etype in _SCALAR:
            min_size = np.dtype(_SCALAR[etype][1]).itemsize
        elif etype in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            min_size = 8 if etype == GGUFValueType.STRING else 12
        else:
            raise GGUFError(f"{self.path}: unknown array element type {etype} at offset {at}")
        if n > (len(self.buf) - self.pos) // min_size:
            raise GGUFError(f"{self.path}: corrupt array length {n} at offset {at + 4} "
                            f"(the file has {len(self.buf) - self.pos} bytes left)")
        if etype == GGUFValueType.STRING:
            return self.strings(n)
        if etype == GGUFValueType.ARRAY:
            return [self.array(depth + 1) for _ in range(n)]
        dtype = np.dtype(_SCALAR[etype][1])
        raw = self.take(n * dtype.itemsize)
        return np.frombuffer(raw, dtype=dtype).tolist()


class GGUFFile:
    """A parsed, validated GGUF file.

    metadata: dict key -> str | int | float | bool | list   (every key/value pair)
    tensors:  dict name -> TensorInfo                         (in file order)
    tensor(name) -> zero-copy np.ndarray view of the mapped file (or of its one in-memory copy):
        float32 (…, K) for F32, float16 (…, K) for F16, uint8 (rows, row_bytes) otherwise.
    """

    def __init__(self, path: str | os.PathLike, mmap: bool | None = True, image: np.ndarray | None = None,
                 shard: bool = False):
        """image: the file's bytes already in process memory (engine/prepared.py: the file as
        a previous load left it, rewritten tensors included); read instead of the file.
        shard: a later file of a split model, read by the first one's `_join`."""
        self.path = str(path)
        self._released: set[str] = set()
        self._shards = {}
        if image is not None:
            self.file_size, self._mm = len(image), image
            self.metadata, self.tensors, self.data_start = self._parse(memoryview(self._mm))
            return
        p = Path(path)
        if not p.exists():
            raise GGUFError(f"{self.path}: no such file")
        if not p.is_file():
            raise GGUFError(f"{self.path}: not a regular file")
        self.file_size = p.stat().st_size
        if self.file_size < 24:
            raise GGUFError(f"{self.path}: not a GGUF file ({self.file_size} bytes, too short)")
        if mmap is None:                              # the default of load(): whatever is faster
            mmap = should_map(self.file_size, resources.available_bytes())
        elif not mmap:
            check_fits(self.file_size, f"{self.path}: reading the file into memory (--no-mmap)",
                       "load it mapped (--mmap)")
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r") if mmap else read_into_memory(self.path)
        self.metadata, self.tensors, self.data_start = self._parse(memoryview(self._mm))
        self._shards: dict[str, GGUFFile] = {}            # tensor name -> the later split file holding it
        n_split = self.metadata.get("split.count", 1)
        if isinstance(n_split, int) and not isinstance(n_split, bool) and n_split > 1 and not shard:
            self._join(n_split)

    def _join(self, n_split: int) -> None:
        """A split model (`NAME-00001-of-0000N.gguf`, llama.cpp's gguf-split): the other files
        beside this one, each mapped, their tensors read whole as this file's.  Mapped only (an
        in-memory copy of the first file is dropped: the layouts made in memory stay per file)."""
        m = SPLIT.search(self.path)
        if m is None or int(m.group(1)) != 1 or int(m.group(2)) != n_split:
            raise GGUFError(f"{self.path}: split.count is {n_split} but the name is not NAME-00001-of-"
                            f"{n_split:05d}.gguf")
        if self.in_memory:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        for i in range(2, n_split + 1):
            part = GGUFFile(f"{self.path[:m.start()]}-{i:05d}-of-{n_split:05d}.gguf", mmap=True, shard=True)
            for name, info in part.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{part.path}: tensor {name!r} is also in an earlier split file")
                self.tensors[name], self._shards[name] = info, part
            self.file_size += part.file_size
        want = self.metadata.get("split.tensors.count", len(self.tensors))
        if want != len(self.tensors):
            raise GGUFError(f"{self.path}: the {n_split} split files hold {len(self.tensors)} tensors, "
                            f"split.tensors.count says {want}")

    def _parse(self, buf):
        cur = _Cursor(buf, self.path)
        if bytes(cur.take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic)")
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {version} (only 2 and 3, little endian)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        if n_tensors > 1 << 20 or n_kv > 1 << 20:
            raise GGUFError(f"{self.path}: corrupt header ({n_tensors} tensors, {n_kv} keys)")
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            at = cur.pos
            key = cur.string()
            if key in meta:
                raise GGUFError(f"{self.path}: duplicate metadata key {key!r} at offset {at}")
            meta[key] = cur.value(cur.scalar("<I"))
        raw_infos = []
        names: set[str] = set()
        for _ in range(n_tensors):
            name = cur.string()
            if name in names:
                raise GGUFError(f"{self.path}: duplicate tensor name {name!r}")
            names.add(name)
            n_dims = cur.scalar("<I")
            if not 1 <= n_dims <= 4:
                raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
            raw_infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        align = meta.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1) \
                or align > 1 << 30:
            raise GGUFError(f"{self.path}: general.alignment {align!r:.40} is not a power of two up to 2^30")
        data_start = -(-cur.pos // align) * align
        tensors = {}
        for name, dims, gtype, rel in raw_infos:
            tensors[name] = self._validate(name, dims, gtype, rel, data_start, align)
        return meta, tensors, data_start

    def _validate(self, name, dims, gtype, rel, data_start, align) -> TensorInfo:
        """Check type, shape and byte range against the file before anything reads it."""
        try:
            qtype = GGMLQuantizationType(gtype)
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown ggml type {gtype}") from None
        if qtype not in GGML_QUANT_SIZES:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown ggml type {qtype.name}")
        block, type_size = GGML_QUANT_SIZES[qtype]
        if any(d <= 0 for d in dims):
            raise GGUFError(f"{self.path}: tensor {name!r} has an empty dimension {dims}")
        if dims[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} row length {dims[0]} is not a multiple of "
                            f"the {qtype.name} block size {block}")
        if rel % align:
            raise GGUFError(f"{self.path}: tensor {name!r} offset {rel} is not {align}-byte aligned")
        n_elems = 1
        for d in dims:                       # Python ints: a lying dim cannot wrap around
            n_elems *= d
        n_bytes = n_elems // block * type_size
        start = data_start + rel
        if start + n_bytes > self.file_size:
            raise GGUFError(f"{self.path}: truncated: tensor {name!r} needs bytes {start}..{start + n_bytes} "
                            f"but the file has {self.file_size}")
        return TensorInfo(name, int(qtype), tuple(int(d) for d in dims), start, n_bytes)

    def tensor(self, name: str) -> np.ndarray:
        """Zero-copy view of a tensor's bytes, shaped as described in the class docstring."""
        if name in self._shards:
            return self._shards[name].tensor(name)
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: missing tensor {name!r}")
        if name in self._released:
            raise GGUFError(f"{self.path}: tensor {name!r} was released (its weights are held in another layout)")
        raw = self._mm[info.offset:info.offset + info.n_bytes]            # (n_bytes,) uint8, no copy
        if info.ggml_type == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(info.shape)
        if info.ggml_type == GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(info.shape)
        n_rows = int(np.prod(info.dims[1:], dtype=np.int64))
        return raw.reshape(n_rows, info.n_bytes // n_rows)               # (rows, row_bytes)

    @property
    def image(self) -> np.ndarray:
        """The file's bytes as this process holds them (mapped, or the in-memory copy)."""
        return self._mm

    @property
    def in_memory(self) -> bool:
        """True when the file was read into process memory (mmap=False)."""
        return not isinstance(self._mm, np.memmap)

    def release(self, name: str) -> None:
        """In-memory copy only: give the pages that lie wholly inside tensor ``name``'s bytes
        back to the operating system (MADV_DONTNEED; they read as zeros from then on), when
        the engine holds its weights in a new array of another layout; the tensor cannot be
        read afterwards.  A mapped file's pages are the page cache's: nothing to do."""
        if name in self._shards:
            return                                           # a later split file: always mapped
        buf = getattr(self._mm, "base", None)                # np.frombuffer's memoryview of the mmap
        buf = getattr(buf, "obj", buf)
        if not self.in_memory or not isinstance(buf, _mmap.mmap) or not hasattr(_mmap, "MADV_DONTNEED"):
            return
        info, page = self.tensors[name], _mmap.PAGESIZE
        lo, hi = -(-info.offset // page) * page, (info.offset + info.n_bytes) // page * page
        if hi > lo:
            buf.madvise(_mmap.MADV_DONTNEED, lo, hi - lo)
        self._released.add(name)

    def rewrite(self, name: str, fn) -> np.ndarray:
        """In-memory copy only: replace tensor ``name``'s bytes by ``fn(view)`` (an array of
        the same shape and dtype, e.g. kernels.registry.prepare's; or the writable view itself,
        rewritten in place by fn) and return the view, read-only again.  The file on disk
        is never written; a mapped file cannot be rewritten."""
        if not self.in_memory:
            raise GGUFError(f"{self.path}: tensor {name!r} can only be rewritten in memory (mmap=False)")
        self._mm.setflags(write=True)
        try:
            view = self.tensor(name)
            new = fn(view)
            if new.shape != view.shape or new.dtype != view.dtype:
                raise ValueError(f"rewrite of {name!r} changed its shape or type")
            if not np.shares_memory(new, view):
                view[...] = new
        finally:
            self._mm.setflags(write=False)
        return self.tensor(name)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: missing metadata key {key!r}")
        return self.metadata[key]
