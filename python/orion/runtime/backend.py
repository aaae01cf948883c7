"""Which backend runs programs: the real ANE (macOS on Apple Silicon) or the emulator.

The choice is made by the native backend registry (``csrc/runtime/backend.cpp``): ``ORION_BACKEND``
when set, else ``"ane"`` when this build has the ANE client and the framework loads (the path can be
overridden with ``ORION_ANE_FRAMEWORK``), else ``"emulator"``, with a one-line warning when an ANE
client exists but its framework does not load (e.g. an Intel Mac).
"""

from __future__ import annotations

import sys

from orion import _core

BACKENDS = ("ane", "emulator")
_warned: set[str] = set()


def backend() -> str:
    """The backend in use: ``"ane"`` or ``"emulator"``. Raises OrionError for a bad ``ORION_BACKEND``."""
    return backend_info()["name"]


def backend_info() -> dict:
    """``{"name", "reason", "warning", "backends": [(name, available, detail)], "ane_client_built",
    "framework_path"}``: the backend in use and why."""
    selection = dict(_core.backend_selection())
    if selection["warning"] and selection["warning"] not in _warned:
        _warned.add(selection["warning"])
        print(selection["warning"], file=sys.stderr)
    selection["backends"] = [tuple(b) for b in _core.backends()]
    selection["ane_client_built"] = _core.ane_client_built()
    selection["framework_path"] = _core.ane_framework_path() or None
    return selection


def compile_count() -> int:
    """Compiles done in this process (they count toward the ~119-per-process ANE budget)."""
    return _core.compile_count()


def compile_budget() -> int:
    """Compiles allowed per process (119 unless ORION_COMPILE_BUDGET overrides it)."""
    return _core.compile_budget()


def compiles_left() -> int:
    """Compiles this process may still do before the budget refuses them (its limit keeps the margin, ANE-11)."""
    return _core.compile_limit() - _core.compile_count()
