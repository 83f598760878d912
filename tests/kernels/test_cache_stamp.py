"""Numba's cache is keyed on the whole kernels folder (kernels/cache.py): an edit of any
kernel file, not only the one defining a function, gives its cached code a new stamp."""
import shutil

from numba.core.caching import FunctionCache

from specdec.kernels import cache, kquants_x16_ir, q8k


def test_every_kernel_function_is_stamped_with_the_whole_folder():
    from numba.core.registry import CPUDispatcher
    jitted = [v for v in vars(q8k).values() if isinstance(v, CPUDispatcher)]
    assert jitted
    for fn in (kquants_x16_ir.MATMUL_Q8K[12], *jitted):
        locator = fn._cache._impl.locator
        assert isinstance(locator, cache._FolderStamp), type(locator)
        assert locator.get_source_stamp() == cache.stamp()


def test_an_edit_of_another_file_changes_the_stamp(tmp_path):
    """The stamp of kquants_x16_ir's drivers moves when kquants_x16_avx2.py (their emitter) or
    ir.py changes, which a per-file stamp would miss."""
    shutil.copytree(cache.HERE, tmp_path / "k", ignore=shutil.ignore_patterns("__pycache__"))
    before = cache.stamp(str(tmp_path / "k"))
    assert before == cache.stamp()
    for name in ("kquants_x16_avx2.py", "ir.py"):
        f = tmp_path / "k" / name
        f.write_text(f.read_text() + "\n# an edit\n")
        after = cache.stamp(str(tmp_path / "k"))
        assert after != before
        before = after


def test_functions_elsewhere_keep_numbas_own_locator(tmp_path):
    from numba import njit
    assert cache.install()                     # already installed: nothing added twice
    f = tmp_path / "elsewhere.py"
    f.write_text("def g(x):\n    return x + 1\n")
    ns = {}
    exec(compile(f.read_text(), str(f), "exec"), ns)
    locator = FunctionCache(njit(cache=True)(ns["g"]).py_func)._impl.locator
    assert not isinstance(locator, cache._FolderStamp)
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    assert sum(issubclass(c, cache._FolderStamp) for c in impl._locator_classes) == 3
