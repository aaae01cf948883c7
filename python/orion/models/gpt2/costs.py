"""GPT-2's cost formulas: weight bytes per layer, and FLOPs and bytes moved per decoded token."""

from __future__ import annotations

from orion.generation.plan import ProgramInfo
from orion.models.gpt2.config import GPT2Config
from orion.quant import head_quant, weight_bytes


def layer_params(config: GPT2Config) -> int:
    """Parameters of one transformer block (its matrices and vectors)."""
    c, f = config.n_embd, config.inner
    return 4 * c * c + 2 * f * c + f + 9 * c


def decode_program_costs(config: GPT2Config, layer_ranges: list[range], head_ranges: list[range],
                         lm_head: str, quant: str = "fp16") -> list[ProgramInfo]:
    """FLOPs and bytes moved per token of each decode program (weight matrices as ``quant`` stores them and
    the LM head as ``head_quant(quant)`` does, ``orion.quant.weight_bytes`` per element; everything else fp16;
    full-context caches)."""
    matrix_bytes, head_bytes = weight_bytes(quant), weight_bytes(head_quant(quant))
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
                                     head_bytes * v * c + 2 * (c * 32 + v * 32)))
    return infos
