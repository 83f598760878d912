""".ci/run's last part: it runs the README's test command, prints the skips by reason in one
line (.ci/skips.py over pytest's -ra summary) and exits with pytest's status, 5 (no tests)
included, or, when pytest passed, 1 if a skip's reason is not in .ci/allowed_skips.txt.  Run
here on a stand-in README whose "test command" prints a summary and exits."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci"))
from skips import allowed, by_reason, main, summary, unlisted  # noqa: E402

ALLOWED = allowed((ROOT / ".ci" / "allowed_skips.txt").read_text())


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
    shutil.copy(ROOT / ".ci" / "allowed_skips.txt", tmp_path / ".ci")
    (tmp_path / "README.md").write_text(f"<!-- test-command -->\n```bash\n{command}\n```\n")
    script = "set -euo pipefail\n" + text[text.index("cmd=$(awk"):]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=60)


def test_only_listed_skips_pass():
    log = ["SKIPPED [3] tests/kernels/test_amx.py:60: no AMX here: the CPU has no AMX int8 (amx_tile, amx_int8)\n",
           "SKIPPED [1] tests/kernels/test_paths.py:70: this host runs one path only (avx2)\n",
           "SKIPPED [2] tests/frontends/serve/test_webui.py:43: no headless browser: needs chromium and "
           "chromedriver (Debian: apt-get install chromium chromium-driver)\n",
           "SKIPPED [1] tests/text/test_vocab_files.py:34: llama.cpp's source tree is not here\n"]
    assert unlisted(by_reason(log[:2]), ALLOWED) == []
    assert unlisted(by_reason(log), ALLOWED) == [(log[2].split(": ", 1)[1].strip(), 2),
                                                 ("llama.cpp's source tree is not here", 1)]
    assert unlisted(by_reason(["3 passed\n"]), ALLOWED) == []


def test_the_allow_list_says_why_and_names_skips_the_tests_make():
    """Each entry has its reason, and its pattern's fixed text is in a test's skip (no stale entry)."""
    assert ALLOWED and all(len(why) > 30 for why in ALLOWED.values())
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py")
                       if p.name != "test_ci.py")
    for pattern in ALLOWED:
        assert all(part in source for part in pattern.split("*") if part.strip(" ()")), pattern
    with pytest.raises(SystemExit, match="line 1"):
        allowed("a skip without its reason\n")


def test_the_command_exits_1_on_an_unlisted_skip(tmp_path, capsys):
    log = tmp_path / "log"
    log.write_text("SKIPPED [1] tests/a.py:3: no source\n")
    assert main([str(log)]) == 0
    assert main(["--allowed", str(ROOT / ".ci" / "allowed_skips.txt"), str(log)]) == 1
    assert "CI: 1 skipped, a reason" in capsys.readouterr().err


ALLOWED_LINE = "SKIPPED [2] tests/a.py:3: no AMX here: none"


@pytest.mark.parametrize("status", [0, 1, 5])
def test_ci_prints_skips_and_keeps_pytest_status(tmp_path, status):
    r = _tail(tmp_path, f"python -c \"print('{ALLOWED_LINE}'); raise SystemExit({status})\"")
    assert r.returncode == status
    assert r.stdout.rstrip().splitlines()[-1] == "skipped 2: 2 no AMX here: none"
    assert ("collected no tests" in r.stderr) == (status == 5)


@pytest.mark.parametrize("status", [0, 1])
def test_ci_fails_on_a_skip_it_does_not_list(tmp_path, status):
    r = _tail(tmp_path, f"python -c \"print('{ALLOWED_LINE}'); print('SKIPPED [1] tests/b.py:4: no source'); "
                        f"raise SystemExit({status})\"")
    assert r.returncode == 1
    assert r.stdout.rstrip().splitlines()[-1] == "skipped 3: 2 no AMX here: none; 1 no source"
    assert "a reason .ci/allowed_skips.txt does not list: no source" in r.stderr
