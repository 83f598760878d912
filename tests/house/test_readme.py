"""The README is a front door: at most ~250 lines, its documentation list before the set-up,
the test command CI runs, and one table per CPU that is what benchmarks/readme_table.py makes
from the JSON it names (docs/speed.md holds the rest)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _table_writer():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_is_short_and_points_to_the_docs_first():
    assert README.count("\n") <= 250
    heads = [ln for ln in README.splitlines() if ln.startswith("## ")]
    assert heads[:2] == ["## Documentation", "## Set-up: two commands"], heads
    assert "<!-- test-command -->" in README and "[docs/speed.md](docs/speed.md)" in README


def test_each_cpus_table_is_the_one_its_json_makes():
    writer = _table_writer()
    blocks = re.findall(r"<!-- speed-summary(?::(\w+))? -->\n(.*?)\n<!-- /speed-summary", README, re.S)
    assert len(blocks) >= 2
    for name, block in blocks:
        source = re.search(r"(benchmarks/results/\w+)/decode\.json", block).group(1)
        anchor = writer._anchor(ROOT / "docs" / "speed.md", name or None)
        redo = f"python benchmarks/readme_table.py --results {source} --summary-only" + f" --block {name}" * bool(name)
        assert block == writer.summary(ROOT / source, anchor), f"README's table is stale: {redo}"
