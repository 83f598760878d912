"""The tree passes the lint CI runs (pyproject.toml [tool.ruff], which says why each rule family
is chosen: pyflakes, lines over 120, bugbear, pylint's errors)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' brings it)")
    r = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]
