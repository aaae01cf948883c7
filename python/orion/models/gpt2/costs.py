"""GPT-2's cost formulas: weight bytes per layer, and FLOPs and bytes moved per decoded token."""

from __future__ import annotations

from orion.generation.plan import ProgramInfo
from orion.models.gpt2.config import GPT2Config


def layer_params(config: GPT2Config) -> int:
    """Parameters of one transformer block (its matrices and vectors)."""
    c, f = config.n_embd, config.inner
    return 4 * c * c + 2 * f * c + f + 9 * c


def decode_program_costs(config: GPT2Config, layer_ranges: list[range], head_ranges: list[range],
                         lm_head: str, matrix_bytes: float = 2, head_bytes: float | None = None) -> list[ProgramInfo]:
    """FLOPs and bytes moved per token of each decode program (weight matrices at ``matrix_bytes`` per
    element: 2 for fp16, 1 for int8; the LM head's at ``head_bytes``, default the same; everything else fp16; full-context caches)."""
    c, t = config.n_embd, config.n_positions
    infos = []
    for r in layer_ranges:
        n = len(r)
        matrices = n * (4 * c * c + 2 * config.inner * c)
        weights = matrix_bytes * matrices + 2 * (n * layer_params(config) - matrices)
        flops = n * (2 * (4 * c * c + 2 * c * config.inner) + 2 * 2 * c * t)  # projections + scores and weighted values
        io = 2 * (c * 32 * 3 * n + n * 2 * c * t + t)  # x/k/v surfaces, both caches, mask (fp16)
        infos.append(ProgramInfo(f"layers {r.start}-{r.stop - 1}", flops, weights + io))
    if lm_head == "ane":
        for r in head_ranges:
            v = len(r)
            infos.append(ProgramInfo(f"lm_head {r.start}-{r.stop - 1}", 2 * v * c,
                                     (matrix_bytes if head_bytes is None else head_bytes) * v * c + 2 * (c * 32 + v * 32)))
    return infos
