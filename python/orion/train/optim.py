"""AdamW on fp32 master weights (in C++, on every core; optionally writing their fp16 copies in the same pass)
and the global gradient norm.

The update is torch.optim.AdamW's: decoupled weight decay on the tensors named in ``decay`` (by default
the matrices, ``ndim >= 2``), bias-corrected moments. Gradients are read as ``grad * grad_scale``, so
undoing the loss scale, the 1/accumulation factor and the clip coefficient cost no extra pass::

    stats = grad_norm(grads)                       # one pass: norm of the finite values, NaN/Inf count
    if stats.nonfinite == 0:
        unscale = 1.0 / (loss_scale * accumulation)
        opt.step(grads, lr, grad_scale=unscale * clip_coefficient(stats.norm * unscale, max_norm=1.0))
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion import _core
from orion.train.errors import TrainError, is_count, is_rate


@dataclass(frozen=True)
class GradStats:
    """The global L2 norm over the finite gradient values, and how many values are NaN or Inf."""

    norm: float
    nonfinite: int

    @property
    def finite(self) -> bool:
        return self.nonfinite == 0


def grad_norm(grads: Mapping[str, np.ndarray]) -> GradStats:
    """Global L2 norm of all gradients (float32, C-contiguous) and their non-finite count, in one pass."""
    names = list(grads)
    sum_sq, nonfinite = _core.train.sum_of_squares(names, [grads[n] for n in names])
    return GradStats(math.sqrt(sum_sq), int(nonfinite))


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ scales by: ``min(1, max_norm / (norm + 1e-6))``."""
    if not max_norm > 0:
        raise TrainError(f"clip_coefficient: max_norm={max_norm} must be > 0")
    return min(1.0, max_norm / (norm + 1e-6))


class AdamW:
    """AdamW over named float32 parameter arrays, updated in place; moments are float32 like torch's.

    ``decay`` names the tensors that get weight decay (default: every tensor with ``ndim >= 2``).
    """

    def __init__(self, params: Mapping[str, np.ndarray], *, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1, decay: Collection[str] | None = None) -> None:
        self.params = dict(params)
        if not self.params:
            raise TrainError("AdamW: no parameters given; pass a dict of name -> float32 array")
        for name, p in self.params.items():
            if not isinstance(p, np.ndarray) or p.dtype != np.float32:
                kind = p.dtype if isinstance(p, np.ndarray) else type(p).__name__
                raise TrainError(f"AdamW: parameter '{name}' is {kind}; master weights must be float32 numpy arrays")
        if decay is None:
            decay = [n for n, p in self.params.items() if p.ndim >= 2]
        unknown = sorted(set(decay) - set(self.params))
        if unknown:
            raise TrainError(f"AdamW: decay names {unknown} are not parameters; use names of {sorted(self.params)[:8]}")
        self.decay = frozenset(decay)
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.step_count = 0
        self.exp_avg = {n: np.zeros_like(p) for n, p in self.params.items()}
        self.exp_avg_sq = {n: np.zeros_like(p) for n, p in self.params.items()}

    def step(self, grads: Mapping[str, np.ndarray], lr: float | None = None, grad_scale: float = 1.0,
             halves: Mapping[str, np.ndarray] | None = None) -> int:
        """One update of every parameter from ``grads`` (same names), at ``lr`` (default: the constructor's).

        ``halves`` (parameter name -> float16 array of its size): in the same pass, each of those parameters'
        fp16 copy (what fp16 programs take) is rewritten from its updated value, finite values clamped to
        +-``FP16_MAX`` first (NaN and Inf kept, as :func:`orion.train.loss_scale.clamp_to_fp16`). Returns how
        many values were clamped."""
        missing, extra = set(self.params) - set(grads), set(grads) - set(self.params)
        if missing or extra:
            raise TrainError(f"AdamW.step: gradients missing for {sorted(missing)[:8]}, unknown {sorted(extra)[:8]}; "
                             "pass exactly one gradient per parameter")
        try:
            lr, grad_scale = float(self.lr if lr is None else lr), float(grad_scale)
        except (TypeError, ValueError) as exc:
            raise TrainError(f"AdamW.step: lr and grad_scale must be numbers ({exc})") from exc
        halves = halves or {}
        unknown = sorted(set(halves) - set(self.params))
        if unknown:
            raise TrainError(f"AdamW.step: fp16 copies of {unknown[:8]}, which are not parameters")
        names = list(self.params)
        clamped = _core.train.adamw_step(
            names, [self.params[n] for n in names], [grads[n] for n in names], [self.exp_avg[n] for n in names],
            [self.exp_avg_sq[n] for n in names], [n in self.decay for n in names], lr, self.betas[0], self.betas[1],
            self.eps, self.weight_decay, self.step_count + 1, grad_scale, [halves.get(n) for n in names])
        self.step_count += 1
        return int(clamped)

    def state_dict(self) -> dict[str, Any]:
        """Step, hyperparameters and the moments (the arrays themselves, not copies)."""
        return {
            "step": self.step_count,
            "hyper": {"lr": self.lr, "betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay,
                      "decay": sorted(self.decay)},
            "exp_avg": self.exp_avg,
            "exp_avg_sq": self.exp_avg_sq,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a ``state_dict()``, copying the moments into this optimizer's arrays; checked first."""
        try:
            hyper, step = state["hyper"], state["step"]
            moments = {"exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}
            decay = frozenset(hyper["decay"])
            numbers = [hyper["lr"], hyper["eps"], hyper["weight_decay"], *hyper["betas"]]
            if not (is_count(step) and len(hyper["betas"]) == 2 and all(is_rate(v) for v in numbers)
                    and max(hyper["betas"]) < 1 and hyper["eps"] > 0):
                raise ValueError(f"step {step!r} or the hyperparameters {hyper!r} are out of range"[:300])
        except (KeyError, TypeError, ValueError) as exc:
            raise TrainError(f"AdamW.load_state_dict: not an AdamW state dict ({exc!r}); pass what state_dict() "
                             "returned") from exc
        for kind, arrays in moments.items():
            if set(arrays) != set(self.params):
                raise TrainError(f"AdamW.load_state_dict: {kind} has tensors {sorted(arrays)[:8]}, the parameters are "
                                 f"{sorted(self.params)[:8]}; load the state of an optimizer over the same parameters")
            for name, array in arrays.items():
                if np.shape(array) != self.params[name].shape:
                    raise TrainError(f"AdamW.load_state_dict: {kind} of '{name}' has shape {np.shape(array)}, the "
                                     f"parameter has {self.params[name].shape}")
        if not decay <= set(self.params):
            unknown = sorted(decay - set(self.params))
            raise TrainError(f"AdamW.load_state_dict: decay names {unknown} are not parameters")
        for kind, arrays in moments.items():
            own = getattr(self, kind)
            for name, array in arrays.items():
                np.copyto(own[name], array, casting="same_kind")
        self.step_count = step
        self.lr, self.betas, self.eps = float(hyper["lr"]), tuple(hyper["betas"]), float(hyper["eps"])
        self.weight_decay, self.decay = float(hyper["weight_decay"]), decay
