"""Test-wide settings: the suite compiles far more programs than the ANE's per-process budget."""

from __future__ import annotations

import os

os.environ.setdefault("ORION_COMPILE_BUDGET", "1000000")
