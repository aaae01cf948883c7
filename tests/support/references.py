"""The independent references of the ``reference`` extra (torch, transformers, peft).

Tests that compare with them skip when they are not installed, except under CI (``CI`` set), where a
missing reference is a failure: CI installs the extra, so a skip there would hide a broken comparison.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(*names: str) -> tuple[ModuleType, ...]:
    """Import each named module; skip (or fail under CI) naming the one that is missing."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as missing:
            message = f"needs {name!r} from the reference extra (pip install '.[reference]'): {missing}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message, allow_module_level=True)
    return tuple(modules)
