"""kernels/README.md, the kernels' map: every name it gives (```module.name```, ```Class.attr```
of a kernels module) exists, every test file it names exists, and every kernel module of
kernels/ appears in the package docstring's module list (kernels/__init__.py)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "kernels" / "README.md"
MODULES = sorted(p.stem for p in (ROOT / "kernels").glob("*.py") if p.stem != "__init__")
NAME = re.compile(r"`([a-z_][\w]*(?:\.[A-Za-z_]\w*)+)`")
TEST = re.compile(r"`(tests/[\w/]+\.py)`")


def _resolve(dotted: str):
    head, *rest = dotted.split(".")
    if head in MODULES:
        obj = importlib.import_module(f"specdec.kernels.{head}")
    elif head == "Kernel":
        obj = importlib.import_module("specdec.kernels.registry").Kernel
    else:
        return None
    for part in rest:
        obj = getattr(obj, part)
    return obj


def test_every_name_in_the_map_exists():
    text = MAP.read_text()
    names = [n for n in NAME.findall(text) if n.split(".")[0] in MODULES or n.startswith("Kernel.")]
    assert len(names) > 40
    missing = []
    for n in names:
        try:
            _resolve(n)
        except (AttributeError, ImportError):
            missing.append(n)
    assert not missing, f"kernels/README.md names what does not exist: {missing}"


def test_every_test_in_the_map_exists():
    tests = TEST.findall(MAP.read_text())
    assert tests and all((ROOT / t).is_file() for t in tests), [t for t in tests if not (ROOT / t).is_file()]


def test_the_package_docstring_lists_every_module():
    doc = importlib.import_module("specdec.kernels").__doc__
    listed = set(re.findall(r"[a-z_]\w*", doc))
    assert not [m for m in MODULES if m not in listed], [m for m in MODULES if m not in listed]
