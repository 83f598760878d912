""".ci/run's last part: it runs the README's test command, prints the skips by reason in one
line (.ci/skips.py over pytest's -ra summary) and exits with pytest's status, 5 (no tests)
included.  Run here on a stand-in README whose "test command" prints a summary and exits."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci"))
from skips import summary  # noqa: E402


def test_skips_by_reason():
    out = summary(["1 passed\n",
                   "SKIPPED [13] tests/text/test_vocab_files.py:34: llama.cpp's source tree is not here\n",
                   "SKIPPED [1] tests/fuzz/test_fuzz_tokenizer.py:147: not installed: no build\n",
                   "SKIPPED [3] tests/fuzz/test_fuzz_tokenizer.py:147: not installed: no build\n",
                   "SKIPPED [1] tests/kernels/test_amx.py: no AMX\n"])
    assert out == ("skipped 18: 13 llama.cpp's source tree is not here; 4 not installed: no build; "
                   "1 no AMX")
    assert summary(["5 passed in 1s\n"]) == "skipped 0"


def _tail(tmp_path: Path, command: str) -> subprocess.CompletedProcess:
    text = (ROOT / ".ci" / "run").read_text()
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "skips.py", tmp_path / ".ci")
    (tmp_path / "README.md").write_text(f"<!-- test-command -->\n```bash\n{command}\n```\n")
    script = "set -euo pipefail\n" + text[text.index("cmd=$(awk"):]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("status", [0, 1, 5])
def test_ci_prints_skips_and_keeps_pytest_status(tmp_path, status):
    r = _tail(tmp_path, f"python -c \"print('SKIPPED [2] tests/a.py:3: no source'); raise SystemExit({status})\"")
    assert r.returncode == status
    assert r.stdout.rstrip().splitlines()[-1] == "skipped 2: 2 no source"
    assert ("collected no tests" in r.stderr) == (status == 5)
