"""The ANE's numeric limits, read from the core (``csrc/hardware_limits.h``): the one place they are written.

``docs/hardware.md`` says where each number comes from.
"""

from __future__ import annotations

from orion import _core

_LIMITS: dict[str, tuple[float, str]] = dict(_core.hardware_limits())

MIN_SURFACE_BYTES: int = int(_LIMITS["MIN_SURFACE_BYTES"][0])
"""Smallest I/O surface the ANE evaluates (ANE-12)."""
MIN_LANES: dict[str, int] = {"fp16": int(_LIMITS["MIN_LANES_FP16"][0]), "fp32": int(_LIMITS["MIN_LANES_FP32"][0])}
"""Fewest lanes (last dimension) of an I/O tensor, by dtype (ANE-14)."""
MAX_CONV_INPUT_CHANNELS: int = int(_LIMITS["MAX_CONV_INPUT_CHANNELS"][0])
"""Conv input channels from which the ANE compiler refuses (ANE-10)."""
SRAM_BYTES: int = int(_LIMITS["SRAM_BYTES"][0])
"""On-chip SRAM a program's working set should fit (ANE-26)."""
DEFAULT_COMPILE_BUDGET: int = int(_LIMITS["DEFAULT_COMPILE_BUDGET"][0])
"""Compiles per process before the ANE fails (ANE-11)."""
DISPATCH_MS: float = float(_LIMITS["DISPATCH_MS"][0])
"""Cost of one evaluate's dispatch, in milliseconds (ANE-28)."""
MAX_RANK: int = int(_LIMITS["MAX_RANK"][0])
"""Highest tensor rank the core takes."""
MAX_ELEMENTS: int = int(_LIMITS["MAX_ELEMENTS"][0])
"""Most elements in one tensor (2^31)."""
FP16_MAX: float = float(_LIMITS["FP16_MAX"][0])
"""Largest finite fp16 value (ANE-25); ``-FP16_MAX`` is the additive mask of a hidden position."""
MAX_INPUT_SURFACES: int = int(_LIMITS["MAX_INPUT_SURFACES"][0])
"""Input surfaces a program binds until a probe report proves more (ANE-37, disputed: maderix/ANE's 0x1d)."""
MAX_OUTPUT_SURFACES: int = int(_LIMITS["MAX_OUTPUT_SURFACES"][0])
"""Output surfaces a program binds until a probe report proves more (ANE-37: the most mechramc/Orion ran)."""
MAX_IO_LANES: int = int(_LIMITS["MAX_IO_LANES"][0])
"""Widest lane axis the I/O packing gives a surface (16,384: the maximum dimension one weak source claims)."""


def describe() -> dict[str, tuple[float, str]]:
    """Every limit by its C++ name: ``(value, description)``."""
    return dict(_LIMITS)
