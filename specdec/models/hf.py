"""GGUF files from a Hugging Face repository: `-hf REPO[:QUANT]` (llama.cpp's flag) and
`specdec.load("hf://REPO[:QUANT]")`.

Through huggingface_hub and its cache, so that a file another tool downloaded is found and one
downloaded here is found by them; HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT and HF_HUB_CACHE /
HF_HOME behave as they do elsewhere (read at each call).  QUANT picks among the repository's
GGUF files as llama.cpp's `-hf` does: case-insensitively, the file whose name carries it
(`Q4_K_M`, `iq4_xs`, ...); without one, Q4_K_M if there is one, else the first GGUF.  Split
files (`NAME-00001-of-00003.gguf`) are fetched together and the first returned (the engine
reads the rest beside it).  huggingface_hub writes each file under a temporary name and renames
it when whole, so nothing half-written is ever in the cache.  Every failure is one line naming
the repository (`HubError`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import SpecdecError

PREFIX = "hf://"
DEFAULT_QUANT = "q4_k_m"
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)


class HubError(SpecdecError):
    """A repository, quant or file that cannot be had."""


def parse(spec: str) -> tuple[str, str | None]:
    """'owner/name[:QUANT]' (or with hf://) -> (repo, quant or None)."""
    s = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
    repo, _, quant = s.partition(":")
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo):
        raise HubError(f"-hf {spec!r}: expected OWNER/NAME[:QUANT]")
    return repo, (quant or None)


def choose(repo: str, files: list[str], quant: str | None, offline: bool = False) -> list[str]:
    """The files of the GGUF QUANT names (all its splits, in order); offline: files are the
    cached ones."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise HubError(f"-hf {repo}: the repository has no GGUF file")
    firsts = [f for f in ggufs if not SPLIT.search(f) or SPLIT.search(f).group(1) == "00001"]
    want = (quant or DEFAULT_QUANT).lower()
    pick = [f for f in firsts if want in Path(f).name.lower()]
    if not pick and quant is None:
        pick = firsts
    if not pick:
        have = ", ".join(sorted({_quant_of(f) for f in firsts}))
        if offline:
            raise HubError(f"-hf {repo}:{quant}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set "
                           f"(cached: {have})")
        raise HubError(f"-hf {repo}:{quant}: no such quant; the repository has {have}")
    first = pick[0]
    m = SPLIT.search(first)
    if m is None:
        return [first]
    stem = first[:m.start()]
    parts = [f"{stem}-{i:05d}-of-{m.group(2)}.gguf" for i in range(1, int(m.group(2)) + 1)]
    missing = [p for p in parts if p not in ggufs]
    if missing:
        raise HubError(f"-hf {repo}: split file {missing[0]} is not in the repository")
    return parts


def _quant_of(name: str) -> str:
    base = SPLIT.sub("", Path(name).name)
    base = base[:-5] if base.lower().endswith(".gguf") else base
    m = re.search(r"((?:I?Q\d[\w]*|F16|BF16|F32|MXFP4\w*))$", base, re.I)
    return m.group(1) if m else base


def _offline() -> bool:
    from huggingface_hub import constants
    v = os.environ.get("HF_HUB_OFFLINE")
    return constants.HF_HUB_OFFLINE if v is None else v.strip().lower() in ("1", "on", "yes", "true")


def _cache_dir() -> str | None:
    return os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)


def _cached_files(repo: str) -> list[str]:
    """The files of the repository's cached snapshot (offline)."""
    from huggingface_hub import constants
    root = Path(_cache_dir() or constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    ref = root / "refs" / "main"
    snap = root / "snapshots" / (ref.read_text().strip() if ref.is_file() else "")
    if not ref.is_file() or not snap.is_dir():
        return []
    return [str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file() or p.is_symlink()]


def resolve(spec: str, progress: bool = True, local_only: bool = False) -> Path:
    """The local path of the GGUF `spec` names, downloaded into the hub's cache if missing
    (local_only: from the cache alone, as with HF_HUB_OFFLINE)."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    repo, quant = parse(spec)
    endpoint, token, cache = os.environ.get("HF_ENDPOINT") or None, os.environ.get("HF_TOKEN") or None, _cache_dir()
    offline = _offline() or local_only
    with _errors(repo, quant, offline):
        if offline:
            files = _cached_files(repo)
            if not files:
                raise HubError(f"-hf {repo}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set")
        else:
            info = HfApi(endpoint=endpoint, token=token).model_info(repo)
            files = [s.rfilename for s in (info.siblings or [])]
        names = choose(repo, files, quant, offline)
        (enable_progress_bars if progress else disable_progress_bars)()
        paths = [hf_hub_download(repo, n, endpoint=endpoint, token=token, cache_dir=cache,
                                 local_files_only=offline) for n in names]
    return Path(paths[0])


class _errors:
    """huggingface_hub's and the network's exceptions as one-line HubErrors naming the repo."""

    def __init__(self, repo: str, quant: str | None, offline: bool):
        self.what, self.offline = repo + (f":{quant}" if quant else ""), offline

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, SpecdecError):
            return False
        from huggingface_hub import errors as he
        w = f"-hf {self.what}"
        if isinstance(e, he.GatedRepoError) or _status(e) in (401, 403):
            msg = f"{w}: access denied (a gated or private repository: set HF_TOKEN to a token that may read it)"
        elif isinstance(e, he.RepositoryNotFoundError) or _status(e) == 404:
            msg = f"{w}: repository not found (or private: set HF_TOKEN)"
        elif isinstance(e, he.LocalEntryNotFoundError):
            msg = (f"{w}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set" if self.offline
                   else f"{w}: cannot reach the hub ({_why(e)}) and the file is not cached")
        elif isinstance(e, (OSError, he.HfHubHTTPError)) or "Connect" in type(e).__name__:
            msg = f"{w}: cannot reach the hub ({_why(e)})"
        else:
            return False
        raise HubError(msg) from None


def _status(e: BaseException) -> int | None:
    r = getattr(e, "response", None)
    return getattr(r, "status_code", None)


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]
