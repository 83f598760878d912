"""The parallel runtime the kernels' ``prange`` loops run on: Numba's threading layer.

Numba runs a parallel region on one of three layers: ``omp`` (GNU OpenMP: each region split
into one static share per thread), ``tbb`` (Intel oneTBB: work stealing) and ``workqueue``
(Numba's own, static shares).  A decode step is some 300 short regions.  On a machine where
another program holds a core, a static share waits for a thread that is not running, every
region, so two threads beside one busy process decode far slower than one thread would; a
work-stealing pool lets the running thread take the waiting share.  The choice was made by
measurement (docs/robustness.md, "Sharing the machine"; benchmarks/contention.py).

    choose()  -> str    pick the layer before the first parallel region runs (kernels/__init__)
    check()             the one-line error of a SPECDEC_THREADING that names no layer
    describe() -> dict  the layer asked for and the one running, as machine_info records them

SPECDEC_THREADING=tbb|omp|workqueue overrides the default (NUMBA_THREADING_LAYER is honoured
too).  oneTBB comes from the ``tbb`` wheel, whose libtbb.so.12 lands in the environment's
lib/ folder, which the dynamic loader does not search in a virtual environment: it is
loaded here by path before Numba looks for it, so no LD_LIBRARY_PATH is needed.  Where it
cannot be loaded (no wheel for the platform) the layer falls back to ``omp``, then
``workqueue``, and says so.  The layer changes scheduling only: every output row is computed
by one iteration of one thread whatever the layer or thread count, so the numbers are the
same bits (tests/engine/test_threads.py).
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

THREADING_ENV = "SPECDEC_THREADING"
LAYERS = ("tbb", "omp", "workqueue")
DEFAULT = "tbb"
_state: dict[str, str] = {}


def _load_tbb() -> bool:
    """Load libtbb.so.12 from the environment's lib/ (the tbb wheel) into the global namespace,
    so that Numba's tbbpool extension finds it; True when a oneTBB library is loaded."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, sys.exec_prefix)):
        lib = Path(prefix) / "lib" / "libtbb.so.12"
        if lib.is_file():
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    try:                                    # a system oneTBB on the loader's path
        ctypes.CDLL("libtbb.so.12", mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def _usable(layer: str) -> bool:
    """Whether Numba's extension for `layer` imports (it links its library on import)."""
    try:
        if layer == "tbb":
            from numba.np.ufunc import tbbpool  # noqa: F401
        elif layer == "omp":
            from numba.np.ufunc import omppool  # noqa: F401
        else:
            from numba.np.ufunc import workqueue  # noqa: F401
        return True
    except ImportError:
        return False


def choose() -> str:
    """Set Numba's threading layer (once per process, before any parallel region runs):
    SPECDEC_THREADING or NUMBA_THREADING_LAYER if set, else DEFAULT, falling back in LAYERS'
    order to the first that loads.  Returns the layer asked for."""
    if "asked" in _state:
        return _state["asked"]
    from numba.core import config
    tbb_ok = _load_tbb()
    asked = os.environ.get(THREADING_ENV, "").strip().lower()
    if asked and asked not in LAYERS:
        _state["error"] = f"{THREADING_ENV}={asked}: the layers are {', '.join(LAYERS)} (unset: {DEFAULT})"
        asked = ""
    if not asked and os.environ.get("NUMBA_THREADING_LAYER"):
        _state["asked"] = config.THREADING_LAYER     # the user's Numba setting stands
        return _state["asked"]
    want = asked or DEFAULT
    layer = next((x for x in [want] + [x for x in LAYERS if x != want]
                  if (x != "tbb" or tbb_ok) and _usable(x)), "default")
    if layer != want:
        _state["fallback"] = f"{want} is not available here, {layer} runs instead"
    if layer != "default":                  # the environment too, so that a reload of Numba's config keeps it
        os.environ["NUMBA_THREADING_LAYER"] = config.THREADING_LAYER = layer
    _state["asked"] = layer
    return layer


def check() -> None:
    """ValueError (one line) when SPECDEC_THREADING names no layer (cpu.check_path calls it)."""
    if "error" in _state:
        raise ValueError(_state["error"])


def describe() -> dict:
    """{'threading_layer': the running layer (or the one asked for before the first parallel
    region), 'threading_asked': ..., 'threading_note': why it fell back, if it did}."""
    import numba
    try:
        running = numba.threading_layer()
    except ValueError:                      # no parallel region has run yet
        running = _state.get("asked", "unset")
    out = {"threading_layer": running, "threading_asked": _state.get("asked", "unset")}
    if "fallback" in _state:
        out["threading_note"] = _state["fallback"]
    return out
