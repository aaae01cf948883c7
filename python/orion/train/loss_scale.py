"""Loss scaling for the fp16 backward, and the counted clamp at every fp32 -> fp16 crossing.

The loss (or dlogits) is multiplied by ``scale`` before the fp16 backward so small gradients do not
flush to zero; the caller divides the gradients by ``scale`` again (``AdamW.step(grad_scale=...)``).
After each backward, ``update(nonfinite)`` says whether the step may be applied: a step with any NaN
or Inf gradient is skipped, never repaired. ``DynamicLossScale`` then halves the scale and grows it
again after ``growth_interval`` good steps (the rule of torch.amp.GradScaler); ``StaticLossScale``
keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from orion import _core
from orion.train.errors import TrainError, check_numbers


@dataclass
class DynamicLossScale:
    """Halve on overflow (skip the step), double after ``growth_interval`` good steps in a row."""

    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    good_steps: int = 0     # finite steps since the last growth or overflow
    skipped_steps: int = 0  # steps skipped for non-finite gradients, in all
    growths: int = 0

    def __post_init__(self) -> None:
        check_numbers(self)
        if not (0 < self.min_scale <= self.scale <= self.max_scale and math.isfinite(self.max_scale)):
            raise TrainError(f"DynamicLossScale: need 0 < min_scale ({self.min_scale}) <= scale ({self.scale}) <= "
                             f"max_scale ({self.max_scale}) < inf")
        if not (self.growth_factor > 1 and 0 < self.backoff_factor < 1 and self.growth_interval >= 1):
            raise TrainError(f"DynamicLossScale: need growth_factor > 1 (got {self.growth_factor}), 0 < backoff_factor "
                             f"< 1 (got {self.backoff_factor}) and growth_interval >= 1 (got {self.growth_interval})")

    def update(self, nonfinite: int) -> bool:
        """Records one backward with ``nonfinite`` NaN/Inf gradient values; True if its step may be applied."""
        if nonfinite:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0
            self.growths += 1
        return True


@dataclass
class StaticLossScale:
    """A fixed scale (256 fixed the fp16 underflow in the public ANE trainers); overflowing steps are skipped."""

    scale: float = 256.0
    skipped_steps: int = 0

    def __post_init__(self) -> None:
        check_numbers(self)
        if not (0 < self.scale < math.inf):
            raise TrainError(f"StaticLossScale: scale={self.scale} must be finite and > 0")

    def update(self, nonfinite: int) -> bool:
        """Records one backward with ``nonfinite`` NaN/Inf gradient values; True if its step may be applied."""
        if nonfinite:
            self.skipped_steps += 1
            return False
        return True


LossScale = DynamicLossScale | StaticLossScale
_KINDS: dict[str, type[DynamicLossScale] | type[StaticLossScale]] = {"dynamic": DynamicLossScale,
                                                                    "static": StaticLossScale}


def state_dict(scaler: LossScale) -> dict[str, Any]:
    """``{"kind": ..., **fields}``: JSON-serializable."""
    kind = next(k for k, cls in _KINDS.items() if type(scaler) is cls)
    return {"kind": kind, **asdict(scaler)}


def from_state_dict(state: Mapping[str, Any]) -> LossScale:
    """The loss scale ``state_dict`` described, counters included."""
    values = dict(state)
    kind = values.pop("kind", None)
    if kind not in _KINDS:
        raise TrainError(f"loss-scale state: kind {kind!r} is not one of {sorted(_KINDS)}")
    expected = {f.name for f in fields(_KINDS[kind])}
    if set(values) != expected:
        raise TrainError(f"loss-scale state for {kind!r}: has {sorted(values)}, expected {sorted(expected)}; pass what "
                         "state_dict() returned")
    return _KINDS[kind](**values)


@dataclass(frozen=True)
class ClampCounts:
    """Values clamped to +-FP16_MAX, and NaN/Inf values seen (left as they are)."""

    clamped: int = 0
    nonfinite: int = 0

    def __add__(self, other: ClampCounts) -> ClampCounts:
        return ClampCounts(self.clamped + other.clamped, self.nonfinite + other.nonfinite)


def clamp_to_fp16(x: np.ndarray, name: str = "tensor") -> ClampCounts:
    """Clamps the finite values of float32 ``x`` to +-``orion.limits.FP16_MAX`` in place, before it becomes fp16.

    NaN and +-Inf are not touched (fp16 keeps them), only counted: they mean something already overflowed,
    and hiding that as 65504 or 0 hides the bug. ``name`` appears in the error for a bad array.
    """
    clamped, nonfinite = _core.train.clamp_fp16(name, x)
    return ClampCounts(int(clamped), int(nonfinite))

