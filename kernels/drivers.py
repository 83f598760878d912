"""The one driver factory: the prange loops that run a kernel module's chunk kernels.

A chunk kernel (an intrinsic or ``@njit`` function of a ``*_ir.py`` module) computes the
output rows of chunk c of n_chunks; its driver runs every chunk in parallel, one per thread:

    @njit(cache=True, nogil=True, parallel=True)
    def <name>(<params>, n_chunks):
        <setup>                                   # e.g. activations rearranged once per call
        for c in prange(n_chunks):
            <kernel>(<params>, c, n_chunks)

``experts`` is the same loop over (expert, chunk) tasks of a mixture-of-experts layer,
``wrapper`` a plain (serial) function that calls a kernel intrinsic, so Python can call it,
and ``loops`` a serial loop over blocks of the kernel a case number picks (a tile per format
and layout: one function, each case's loop compiled with its own kernel inside).

Why a factory writes them from source: Numba caches a compiled function per definition and
keys the cache on the source file that defines it.  A closure over the kernel cannot be
cached (its key would pickle the kernel, whose id is new in every process), and a driver in
another file than its kernel would not be recompiled when the kernel's IR changes.  So each
driver is compiled from this template *as code of the kernel's own module*: its globals are
the module's, its file name the module's file (and cache.py keys the cache on every file of
the folder, so an edit of an emitter the kernel uses invalidates it too).
Every driver is compiled once per process at its first call (or read from the cache).
A hand-written factory of cached functions closing over intrinsics (the AMX drivers) names
its intrinsics with ``keyed`` instead, for the same reason.
"""
from __future__ import annotations

_CHUNKED = """
def {name}({params}, n_chunks):
    {setup}
    for c in prange(n_chunks):
        {kernel}({params}, c, n_chunks)
"""

_EXPERTS = """
def {name}(w3, ids, {params}, n_chunks):
    for t in prange(ids.shape[0] * n_chunks):
        g = t // n_chunks
        {kernel}(w3[ids[g]], {indexed}, t % n_chunks, n_chunks)
"""


_WRAPPER = """
def {name}({params}):
    {kernel}({params})
"""


_LOOPS_CASE = """
    {cond} case == {case}:
        for i in range(n):
            {kernel}({call})"""


def _define(module: dict, name: str, kernel, template: str, parallel: bool = True, **fields):
    """Compile the template's function ``name`` into the module whose globals are `module`, as
    code of that module's file, calling ``kernel`` (bound there as the global ``_<name>``), and
    return it under ``@njit(cache=True, nogil=True)`` (parallel: with Numba's parallel loops)."""
    from numba import njit, prange
    module.setdefault("prange", prange)
    module["_" + name] = kernel
    source = template.format(name=name, kernel="_" + name, **fields)
    exec(compile(source, module["__file__"], "exec"), module)
    fn = njit(cache=True, nogil=True, parallel=parallel)(module[name])
    module[name] = fn
    return fn


def chunked(module: dict, name: str, kernel, params: str, setup: str = "pass"):
    """The driver ``name(<params>, n_chunks)`` of the chunk kernel ``kernel(<params>, c,
    n_chunks)``; setup: one statement run before the parallel loop."""
    return _define(module, name, kernel, _CHUNKED, params=params, setup=setup)


def experts(module: dict, name: str, kernel, params: str):
    """The driver ``name(w3, ids, <params>, n_chunks)``: prange over (expert g, chunk) of the
    chunk kernel on w3[ids[g]] with each of params indexed [g] (one expert's input and output)."""
    indexed = ", ".join(f"{p.strip()}[g]" for p in params.split(","))
    return _define(module, name, kernel, _EXPERTS, params=params, indexed=indexed)


def wrapper(module: dict, name: str, kernel, params: str):
    """A serial ``name(<params>)`` that calls the kernel intrinsic ``kernel(<params>)``."""
    return _define(module, name, kernel, _WRAPPER, parallel=False, params=params)


def loops(module: dict, name: str, kernels: dict, params: str, call: str):
    """A serial ``name(case, n, <params>)``: ``for i in range(n): kernels[case](<call>)``,
    call written in terms of params, i and n (the kernels bound as ``_<name>_<case>``)."""
    body = []
    for j, (case, kernel) in enumerate(kernels.items()):
        module[f"_{name}_{case}"] = kernel
        body.append(_LOOPS_CASE.format(cond="if" if j == 0 else "elif", case=case,
                                       kernel=f"_{name}_{case}", call=call))
    source = f"def {name}(case, n, {params}):" + "".join(body) + "\n"
    return _define(module, name, None, "{source}", parallel=False, source=source)


def keyed(intrinsic, key: str):
    """The intrinsic with a fixed id: a cached ``@njit`` closure over it (a factory's) is keyed
    by Numba on its pickled closure, and an intrinsic pickles its id, otherwise new in every
    process (the cached code would never be found again: compiled anew each time).

    Numba offers no public way to fix that id: this wrapper is the kernels' one use of the
    private ``_set_uuid`` (tests/kernels/test_drivers.py fails on a Numba without it, and
    checks that the id is the key)."""
    set_uuid = getattr(intrinsic, "_set_uuid", None)
    if set_uuid is None:
        raise RuntimeError(f"this Numba cannot key the intrinsic {key} (no _set_uuid): drivers.keyed needs a new way")
    set_uuid(f"specdec.kernels:{key}")
    return intrinsic
