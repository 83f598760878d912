"""A source checkout imports its kernels the ordinary way (pyproject.toml's package-dir makes
kernels/ the subpackage specdec.kernels on install); run without an install, or with another
checkout's install, it fails in one line that says `pip install -e .`."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# drop the editable install's finder: the interpreter of a checkout that was never installed
NO_INSTALL = ("import sys; sys.meta_path = [f for f in sys.meta_path "
              "if 'editable' not in getattr(f, '__module__', '')]; ")


def _checkout(tmp_path: Path) -> Path:
    """A copy of the checkout's top (specdec/__init__.py, kernels/__init__.py, pyproject.toml)."""
    (tmp_path / "specdec").mkdir()
    (tmp_path / "kernels").mkdir()
    shutil.copy(ROOT / "specdec" / "__init__.py", tmp_path / "specdec")
    (tmp_path / "kernels" / "__init__.py").write_text("")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _import(cwd: Path, prelude: str = "") -> str:
    r = subprocess.run([sys.executable, "-c", prelude + "import specdec"], cwd=cwd, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    return r.stderr.strip().splitlines()[-1]


def test_installed_kernels_are_this_checkouts():
    import specdec.kernels
    assert Path(specdec.kernels.__file__).resolve().parent in (ROOT / "kernels", ROOT / "specdec" / "kernels")


def test_checkout_without_install_says_pip_install(tmp_path):
    last = _import(_checkout(tmp_path), NO_INSTALL)
    assert last.startswith("ImportError: specdec.kernels is not installed") and "`pip install -e .`" in last


def test_checkout_beside_another_install_says_pip_install(tmp_path):
    last = _import(_checkout(tmp_path))
    assert last.startswith("ImportError: specdec.kernels is ") and "`pip install -e .`" in last
