"""Module names say one thing each: no two modules in specdec/ or kernels/ share a file name
(three `model.py`s once meant three different things), and no module's first line names
another module's file as itself."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> list[Path]:
    return sorted(p for top in ("specdec", "kernels") for p in (ROOT / top).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_no_two_modules_share_a_file_name():
    by_name = defaultdict(list)
    for p in _modules():
        by_name[p.name].append(str(p.relative_to(ROOT)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"module file names used twice: {shared}"


def test_the_check_sees_a_shared_name(tmp_path):
    """The check above can fail: two folders with the same file name are found."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "plan.py").write_text('"""x"""\n')
    names = [p.name for p in tmp_path.rglob("*.py")]
    assert len(names) != len(set(names))
