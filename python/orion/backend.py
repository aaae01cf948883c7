"""Which backend runs programs: the real ANE (macOS on Apple Silicon) or the emulator."""

from __future__ import annotations

import os
import platform

from orion import _core
from orion.errors import OrionError

BACKENDS = ("ane", "emulator")


def backend() -> str:
    """The backend in use: ``ORION_BACKEND`` when set, else ``"ane"`` where available, else
    ``"emulator"``."""
    requested = os.environ.get("ORION_BACKEND", "").strip().lower()
    if requested and requested not in BACKENDS:
        raise OrionError(f"ORION_BACKEND={requested!r} is not a backend; use one of {', '.join(BACKENDS)} or unset it")
    if requested == "ane":
        raise OrionError(
            f"ORION_BACKEND=ane, but this build has no ANE client ({platform.system()} {platform.machine()}); "
            "the ane backend needs macOS on Apple Silicon. Unset ORION_BACKEND to use the emulator."
        )
    return "emulator"


def compile_count() -> int:
    """Compiles done in this process (they count toward the ~119-per-process ANE budget)."""
    return _core.compile_count()


def compile_budget() -> int:
    """Compiles allowed per process (119 unless ORION_COMPILE_BUDGET overrides it)."""
    return _core.compile_budget()
