"""Resource limits: a context or a --no-mmap read that does not fit in memory, and prompts
beyond the context, are one-line errors raised before anything is allocated."""
from __future__ import annotations

import subprocess
import sys

import pytest

import specdec
from specdec.engine import resources
from specdec.errors import ConfigError, ContextOverflowError, ResourceError
from specdec.engine.kv_cache import KVCache
from synth import TinySpec, write_tiny_model


def test_meminfo_parsing(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text("MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n")
    assert resources.available_bytes(str(p)) == 8000000 * 1024
    p.write_text("MemTotal: 5 kB\n")
    assert resources.available_bytes(str(p)) is None
    assert resources.available_bytes(str(tmp_path / "none")) is None


def test_kv_cache_larger_than_memory(tiny_model, monkeypatch):
    m = tiny_model(TinySpec())
    monkeypatch.setattr(resources, "available_bytes", lambda meminfo=None: 1 << 20)
    need = KVCache.bytes_for(m.config.n_layer, m.config.n_head_kv, 100_000, m.config.d_head)
    assert need > 1 << 20
    with pytest.raises(ResourceError) as e:
        m.session(n_ctx=100_000)
    msg = str(e.value)
    assert "\n" not in msg and "--ctx-size 100000" in msg and "GiB" in msg
    assert m.session(n_ctx=64).n_ctx == 64               # a context that fits still works


def test_absurd_context_without_patching(tiny_model):
    """10^12 positions: refused by the real MemAvailable check, not a numpy MemoryError."""
    m = tiny_model(TinySpec())
    with pytest.raises(ResourceError, match="--ctx-size 1000000000000"):
        m.session(n_ctx=10 ** 12)
    with pytest.raises(ConfigError, match="--ctx-size"):
        KVCache(1, 1, 0, 8)


def test_no_mmap_file_larger_than_memory(tmp_path, monkeypatch):
    p = write_tiny_model(tmp_path / "t.gguf")
    monkeypatch.setattr(resources, "available_bytes", lambda meminfo=None: 1000)
    with pytest.raises(ResourceError) as e:
        specdec.load(p, mmap=False)
    assert "\n" not in str(e.value) and "t.gguf" in str(e.value) and "--no-mmap" in str(e.value)
    assert specdec.load(p, mmap=True).config.n_layer == 2    # mapped: nothing is read up front


def test_prompt_beyond_context(tiny_model):
    m = tiny_model(TinySpec(n_ctx=16))
    with pytest.raises(ContextOverflowError, match="--ctx-size 8"):
        m.generate(list(range(10)), n_predict=2, n_ctx=8)


def test_cli_ctx_size_beyond_memory(tmp_path):
    p = write_tiny_model(tmp_path / "t.gguf")
    r = subprocess.run([sys.executable, "-m", "specdec.frontends.cli", "run", "-m", str(p), "-p", "ab", "-n", "1",
                        "-c", str(10 ** 12)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "--ctx-size" in lines[0], r.stderr
