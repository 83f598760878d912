"""Will it fit?  Checks made before an allocation that the machine cannot satisfy, so that
the user gets a one-line ResourceError instead of a MemoryError or the OOM killer.

    available_bytes()                      MemAvailable of /proc/meminfo, None where unknown
    check_fits(n_bytes, what, hint)        ResourceError when n_bytes > available
"""
from __future__ import annotations

from ..errors import ResourceError

MEMINFO = "/proc/meminfo"


def available_bytes(meminfo: str = MEMINFO) -> int | None:
    """The kernel's estimate of memory available without swapping, in bytes (None: unknown,
    e.g. not Linux)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def check_fits(n_bytes: int, what: str, hint: str = "") -> None:
    """Raise ResourceError when n_bytes exceed the memory available now."""
    avail = available_bytes()
    if avail is not None and n_bytes > avail:
        raise ResourceError(f"{what} needs {_gib(n_bytes)} but only {_gib(avail)} of memory is available"
                            + (f"; {hint}" if hint else ""))
