"""drivers.keyed: the one use of a private Numba API in the kernels (an intrinsic's fixed id),
checked on the Numba installed: a keyed intrinsic carries its key, the same in every process,
and an njit function that calls it still compiles and runs."""
from __future__ import annotations

import pickle

from numba import njit, types
from numba.extending import intrinsic

from specdec.kernels import drivers


def _make():
    @intrinsic
    def plus_one(typingctx, x):
        def codegen(context, builder, sig, args):
            return builder.add(args[0], context.get_constant(types.int64, 1))
        return types.int64(types.int64), codegen
    return plus_one


def test_a_keyed_intrinsic_has_the_keys_id_and_still_runs():
    a, b = drivers.keyed(_make(), "test.plus_one"), drivers.keyed(_make(), "test.plus_one")
    assert a._uuid == b._uuid == "specdec.kernels:test.plus_one"
    assert pickle.dumps(a._uuid) == pickle.dumps(b._uuid)

    @njit
    def call(x):
        return a(x)
    assert call(41) == 42
