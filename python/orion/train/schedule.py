"""Learning-rate schedules indexed by optimizer step, with a serializable position.

``WarmupCosine``: linear warmup to ``max_lr`` over ``warmup_steps`` updates, then a cosine from
``max_lr`` down to ``min_lr`` at ``total_steps`` (and ``min_lr`` after). ``Constant``: one rate. Both
count updates from 0: ``lr`` is the rate of the next update, ``advance()`` moves past it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orion.train.errors import TrainError, check_numbers


@dataclass
class Constant:
    """The same rate for every update."""

    lr: float
    position: int = 0

    def __post_init__(self) -> None:
        check_numbers(self)

    def lr_at(self, step: int) -> float:
        return self.lr


@dataclass
class WarmupCosine:
    """Update i (0-based) gets ``max_lr * (i+1) / warmup_steps`` while ``i < warmup_steps``, then
    ``min_lr + (max_lr - min_lr) * (1 + cos(pi * (i - warmup_steps) / (total_steps - warmup_steps))) / 2``,
    and ``min_lr`` from ``total_steps`` on."""

    max_lr: float
    warmup_steps: int
    total_steps: int
    min_lr: float = 0.0
    position: int = 0

    def __post_init__(self) -> None:
        check_numbers(self)
        if self.min_lr > self.max_lr:
            raise TrainError(f"WarmupCosine: min_lr={self.min_lr} is above max_lr={self.max_lr}")
        if self.total_steps <= self.warmup_steps:
            raise TrainError(f"WarmupCosine: total_steps={self.total_steps} must exceed warmup_steps="
                             f"{self.warmup_steps}")

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.max_lr * (step + 1) / self.warmup_steps
        if step >= self.total_steps:
            return self.min_lr
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.min_lr + (self.max_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


Schedule = Constant | WarmupCosine
_KINDS: dict[str, type[Constant] | type[WarmupCosine]] = {"constant": Constant, "warmup_cosine": WarmupCosine}


def current_lr(schedule: Schedule) -> float:
    """The rate of the next update (at ``schedule.position``)."""
    return schedule.lr_at(schedule.position)


def advance(schedule: Schedule) -> float:
    """Returns the rate of the next update and moves the position past it."""
    lr = current_lr(schedule)
    schedule.position += 1
    return lr


def state_dict(schedule: Schedule) -> dict[str, Any]:
    """``{"kind": ..., **parameters, "position": ...}``: JSON-serializable."""
    kind = next(k for k, cls in _KINDS.items() if type(schedule) is cls)
    return {"kind": kind, **asdict(schedule)}


def from_state_dict(state: Mapping[str, Any]) -> Schedule:
    """The schedule ``state_dict`` described, at its saved position."""
    fields = dict(state)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise TrainError(f"schedule state: kind {kind!r} is not one of {sorted(_KINDS)}; pass what state_dict() "
                         "returned")
    try:
        return _KINDS[kind](**fields)
    except TypeError as exc:
        raise TrainError(f"schedule state for {kind!r}: {exc}; pass what state_dict() returned") from exc
