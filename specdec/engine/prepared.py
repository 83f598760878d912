"""Prepared weights on disk: what load-time preparation makes of a GGUF file, kept for the next load.

Loading a model into memory lays most of its layer weights out for the kernels (K-quants
interleaved 16 rows per record, legacy quants in 8-row records: kernels/registry.py) and may requantize
some (engine/requant.py).  The result depends only on the file's bytes, the preparation's
parameters and the kernels' byte layouts, so the first load writes it next to the model cache
and later loads read it back instead of preparing again:

    <cache>/prepared/<file stem>-<key>/
        index.json   what is inside: the key, the rewritten tensors' types, the requantized
                     arrays' types, shapes and offsets, and a CRC-32 per 64 MiB of each file
        image.bin    the GGUF file as it sits in memory after the rewrites (same size and
                     layout: GGUFFile reads its header and views its tensors as usual)
        extra.bin    the requantized arrays, one after the other (64-byte aligned)

key = SHA-256 of the file's size, mtime and first and last MiB, the parameters (activations,
requantization) and LAYOUT_VERSION (bumped with any change to a prepared byte layout).  A
folder is written under a temporary name and renamed into place (atomic); on load every
check must hold — index readable, key, sizes, every chunk's CRC — or the folder is deleted and
the weights prepared afresh (never trusted).  SPECDEC_PREPARED=0 (or `--no-prepared`) turns it
off; `specdec models` lists the folders and their sizes.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .gguf_file import read_into_memory

LAYOUT_VERSION = 3        # kernels/repack.py, kquants_x16.py, engine/requant.py byte layouts
ENV = "SPECDEC_PREPARED"  # "0" / "off" / "false": neither read nor written
CHUNK = 64 << 20          # bytes per CRC-32
ALIGN = 64


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def root() -> Path:
    from ..models.hub import cache_dir                  # the model cache's folder
    return cache_dir() / "prepared"


@dataclass
class Prepared:
    """What preparation made: in `image` (the in-memory file, or None when it was mapped)
    the tensors of `rewritten` (name -> the type id of their new bytes); new arrays in
    `extra` (key -> (type id, array)), keyed by tensor name (+ '#head' for a head made from
    a table)."""
    image: np.ndarray | None = None
    rewritten: dict[str, int] = field(default_factory=dict)
    extra: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rewritten or self.extra)


def _file_key(path: str, params: str) -> str:
    """A key of the file's identity: layout version, parameters, size, mtime and its first
    and last MiB (read once per process for a given size and mtime)."""
    st = os.stat(path)
    return _key_of(os.path.abspath(path), params, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _key_of(path: str, params: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256(f"{LAYOUT_VERSION}|{params}|{size}|{mtime_ns}|".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()


def folder(path: str, params: str) -> Path:
    return root() / f"{Path(path).stem}-{_file_key(path, params)[:16]}"


def _crcs(buf: np.ndarray) -> list[int]:
    """CRC-32 of each CHUNK of buf, two threads (zlib releases the GIL)."""
    parts = [buf[i:i + CHUNK] for i in range(0, len(buf), CHUNK)] or [buf]
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(zlib.crc32, parts))


def load(path: str, params: str, want_image: bool = True) -> Prepared | None:
    """The prepared weights of the file at path for these parameters, read into memory and
    verified; None when off, absent or failing any check (a bad folder is removed).
    want_image=False: the requantized arrays only (a mapped load rewrites nothing)."""
    if not enabled():
        return None
    d = folder(path, params)
    if not (d / "index.json").is_file():
        return None
    try:
        index = json.loads((d / "index.json").read_text())
        if index.get("key") != _file_key(path, params) or index.get("version") != LAYOUT_VERSION:
            raise ValueError("key")
        image = None
        if index["image_crc"] is not None and want_image:
            if (d / "image.bin").stat().st_size != os.path.getsize(path):
                raise ValueError("image size")
            with ThreadPoolExecutor(1) as ex:           # each window's CRC beside the next read
                jobs = []
                image = read_into_memory(str(d / "image.bin"), lambda v: jobs.append(ex.submit(zlib.crc32, v)),
                                         CHUNK)
                if [j.result() for j in jobs] != index["image_crc"]:
                    raise ValueError("image crc")
        extra: dict[str, tuple[int, np.ndarray]] = {}
        if index["extra"]:
            raw = read_into_memory(str(d / "extra.bin"))    # huge pages, as the image
            if len(raw) != index["extra_size"] or _crcs(raw) != index["extra_crc"]:
                raise ValueError("extra")
            for key, e in index["extra"].items():
                a = raw[e["offset"]:e["offset"] + e["nbytes"]].view(e["dtype"]).reshape(e["shape"])
                a.flags.writeable = False
                extra[key] = (int(e["qtype"]), a)
        if want_image and index["image_crc"] is None and index["rewritten"]:
            raise ValueError("image")
        return Prepared(image, {k: int(v) for k, v in index["rewritten"].items()}, extra)
    except (OSError, ValueError, KeyError, TypeError):
        shutil.rmtree(d, ignore_errors=True)        # stale, truncated or foreign: rebuilt
        return None


def save(path: str, params: str, prep: Prepared) -> Path | None:
    """Write prep for the next load (atomically); None when off, empty or the disk refuses."""
    if not enabled() or not prep:
        return None
    d = folder(path, params)
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}-", dir=d.parent))
        index = {"version": LAYOUT_VERSION, "key": _file_key(path, params), "params": params,
                 "source": os.path.abspath(path), "rewritten": prep.rewritten,
                 "image_crc": None, "extra": {}, "extra_size": 0, "extra_crc": None}
        if prep.rewritten:
            prep.image.tofile(tmp / "image.bin")
            index["image_crc"] = _crcs(prep.image)
        if prep.extra:
            off, arrays = 0, []
            for key, (qtype, a) in prep.extra.items():
                a = np.ascontiguousarray(a)
                index["extra"][key] = {"qtype": qtype, "dtype": a.dtype.str, "shape": list(a.shape),
                                       "offset": off, "nbytes": a.nbytes}
                arrays.append((off, a))
                off = -(-(off + a.nbytes) // ALIGN) * ALIGN
            raw = np.zeros(off, np.uint8)
            for o, a in arrays:
                raw[o:o + a.nbytes] = a.reshape(-1).view(np.uint8)
            raw.tofile(tmp / "extra.bin")
            index["extra_size"], index["extra_crc"] = off, _crcs(raw)
        (tmp / "index.json").write_text(json.dumps(index))
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
        return d
    except OSError:
        shutil.rmtree(locals().get("tmp", d.parent / ".none"), ignore_errors=True)
        return None


def listing() -> list[tuple[str, int]]:
    """(folder name, bytes) of every prepared folder in the cache."""
    r = root()
    if not r.is_dir():
        return []
    return sorted((p.name, sum(f.stat().st_size for f in p.iterdir() if f.is_file()))
                  for p in r.iterdir() if p.is_dir() and not p.name.startswith("."))
