"""Llama's cost formulas: FLOPs and bytes moved per decoded token of each decode program."""

from __future__ import annotations

from orion.generation.plan import ProgramInfo
from orion.limits import MIN_LANES
from orion.models.llama.config import LlamaConfig
from orion.quant import head_quant, weight_bytes


def decode_program_costs(config: LlamaConfig, context: int, layer_ranges: list[range], head_ranges: list[range],
                         lm_head: str, quant: str = "fp16") -> list[ProgramInfo]:
    """FLOPs and bytes moved per token of each decode program (weight matrices as ``quant`` stores them and
    the LM head as ``head_quant(quant)`` does, ``orion.quant.weight_bytes`` per element; the rest fp16;
    full-``context`` KV caches of ``n_kv_heads`` heads; every small surface is padded to the ANE's minimum lanes)."""
    matrix_bytes, head_bytes = weight_bytes(quant), weight_bytes(head_quant(quant))
    d, q, kv, t, lanes = config.dim, config.q_dim, config.kv_dim, context, MIN_LANES["fp16"]
    matmuls = d * q + 2 * d * kv + q * d + 3 * d * config.hidden_dim
    infos = []
    for r in layer_ranges:
        n = len(r)
        flops = n * (2 * matmuls + 2 * 2 * q * t)  # projections + every query head's scores and weighted values
        surfaces = 2 * d * lanes + 2 * config.head_dim * lanes + t  # x in and out, the rope row, the mask
        surfaces += n * (2 * kv * lanes + 2 * kv * t)  # new keys/values out, both caches in
        weights = matrix_bytes * n * matmuls + 2 * n * (config.layer_param_count() - matmuls)
        infos.append(ProgramInfo(f"layers {r.start}-{r.stop - 1}", flops, weights + 2 * surfaces))
    if lm_head == "ane":
        for r in head_ranges:
            v = len(r)
            infos.append(ProgramInfo(f"lm_head {r.start}-{r.stop - 1}", 2 * v * d,
                                     head_bytes * v * d + 2 * (d + d * lanes + v * lanes)))
    return infos
