"""RoPE's frequencies as transformers computes them (``transformers.modeling_rope_utils``): the base
frequencies of the rotated channels (``partial_rotary_factor`` of each head), rescaled by ``linear``,
``dynamic`` (NTK), ``llama3``, ``yarn`` or ``longrope``, and the attention factor that scales cos and sin.

:class:`RopeScaling` holds a ``rope_parameters`` (or ``rope_scaling``) object's values; :func:`frequencies`
gives the inverse frequencies and attention factor of a forward pass over positions below ``seq_end``.

- ``dynamic`` changes the base only for sequences longer than ``max_position_embeddings``, which Orion's
  context never exceeds (``graphs._check_span``): within it, transformers' frequencies are the default ones,
  which is what this returns.
- ``longrope`` uses ``short_factor`` while the forward pass ends within ``original_max_position_embeddings``
  and ``long_factor`` past it (transformers' choice, by the pass's largest position + 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")

# The keys each rope_type reads (besides rope_type/type, rope_theta and partial_rotary_factor).
ROPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                       "mscale", "mscale_all_dim", "truncate"}),
    "longrope": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "short_factor",
                           "long_factor"}),
}
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",), "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("original_max_position_embeddings",),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling's parameters, as ``config.json`` gives them (None: absent, transformers' default applies)."""

    rope_type: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None


def _base(theta: float, dim: int) -> np.ndarray:
    """The unscaled inverse frequencies of ``dim`` rotated channels: theta^(-2i/dim), i < dim/2."""
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def _yarn(s: RopeScaling, theta: float, dim: int, context: int) -> tuple[np.ndarray, float]:
    omp = s.original_max_position_embeddings
    factor = s.factor if s.factor is not None else context / omp

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.attention_factor
    if attention is None:
        attention = mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim) if s.mscale and s.mscale_all_dim \
            else mscale(factor)
    fast, slow = s.beta_fast or 32, s.beta_slow or 1

    def correction(rotations: float) -> float:
        return dim * math.log(omp / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(fast), correction(slow)
    if s.truncate is None or s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp
    base = _base(theta, dim)
    return base / factor * (1 - extrapolate) + base * extrapolate, float(attention)


def _llama3(s: RopeScaling, theta: float, dim: int) -> np.ndarray:
    base = _base(theta, dim)
    old, low, high, factor = s.original_max_position_embeddings, s.low_freq_factor, s.high_freq_factor, s.factor
    wavelen = 2 * math.pi / base
    scaled = np.where(wavelen > old / low, base / factor, base)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)


def frequencies(scaling: RopeScaling | None, theta: float, dim: int, context: int,
                seq_end: int) -> tuple[np.ndarray, float]:
    """``(inverse frequencies [dim / 2], attention factor)`` of ``dim`` rotated channels for a forward pass over
    positions below ``seq_end``; ``context``: the config's ``max_position_embeddings``."""
    if scaling is None or scaling.rope_type in ("default", "dynamic"):  # dynamic: see the module docstring
        return _base(theta, dim), 1.0
    kind = scaling.rope_type
    if kind == "linear":
        return _base(theta, dim) / scaling.factor, 1.0
    if kind == "llama3":
        return _llama3(scaling, theta, dim), 1.0
    if kind == "yarn":
        return _yarn(scaling, theta, dim, context)
    omp = scaling.original_max_position_embeddings  # longrope
    factor = scaling.factor if scaling.factor is not None else context / omp
    attention = scaling.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(omp))
    ext = np.asarray(scaling.long_factor if seq_end > omp else scaling.short_factor, np.float64)
    return _base(theta, dim) / ext, float(attention)
