"""Numba's on-disk cache, keyed on the whole kernels folder instead of one file.

Numba stamps a cached function with the content hash of the file that defines it.  A kernel
here is rarely one file: a driver in kquants_x16_ir.py compiles IR that ir.py,
kquants_decode.py and kquants_x16_avx2.py emit, repack.py's tiles are legacy_ir.py's code.
Keyed on its own file, an edit of an emitter left the old machine code in the cache.
``install()`` puts a locator in front of Numba's own for the functions defined in this
folder: the same cache folders, but stamped with one hash of every ``*.py`` file here, so
an edit of any kernel file recompiles every kernel (once, at its first call).

Imports nothing from this package: kernels/__init__.py installs it before any ``@njit``.
"""
from __future__ import annotations

import functools
import hashlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def stamp(folder: str = HERE) -> str:
    """sha256 over the names and bytes of the folder's ``*.py`` files, in name order."""
    h = hashlib.sha256()
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
        with open(os.path.join(folder, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


_stamp = functools.lru_cache(maxsize=1)(stamp)


def code_stamp() -> str:
    """stamp() of this folder, computed once per process: the identity of the kernels' code
    (also in the key of a model's calibrated pass costs: new kernels, new costs)."""
    return _stamp()


class _FolderStamp:
    """A Numba locator mixin: found for the functions of this folder only, stamped with stamp()."""

    def get_source_stamp(self):
        return code_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.dirname(os.path.abspath(py_file)) != HERE:
            return None
        return super().from_function(py_func, py_file)


def _locators():
    from numba.core import caching
    bases = [getattr(caching, n, None) or getattr(caching, "_" + n, None)   # 0.68's names, or older ones
             for n in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
    return [type("Folder" + b.__name__, (_FolderStamp, b), {}) for b in bases if b is not None]


def install() -> bool:
    """Put the folder-stamped locators first in Numba's list (once); False where this Numba
    has no such list (then each function keeps its own file's stamp)."""
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if not isinstance(classes, list):
        return False
    if not any(issubclass(c, _FolderStamp) for c in classes):
        classes[:0] = _locators()
    return True
