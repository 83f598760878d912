"""docs/architecture.png is the picture docs/map.py draws from the imports now: compared by the
digest the PNG carries (cheap: no drawing), and the script draws (matplotlib, the test extra)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _map():
    spec = importlib.util.spec_from_file_location("docs_map", ROOT / "docs" / "map.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_picture_is_current():
    m = _map()
    assert m.png_digest(m.PNG) == m.digest(m.graph()), "docs/architecture.png is stale: run python docs/map.py"


def test_the_script_draws_it(tmp_path):
    pytest.importorskip("matplotlib")
    m = _map()
    out = tmp_path / "a.png"
    assert m.main(["--out", str(out)]) == 0
    assert m.png_digest(out) == m.digest(m.graph()) and m.main(["--check", "--out", str(out)]) == 0
