"""Gemma 2 and Gemma 3 (text) on Orion: the hooks of the model-independent generation loop."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from orion.generation.loop import CausalLM
from orion.generation.plan import ProgramInfo
from orion.generation.tokenizer import Tokenizer, TokenizerNotFound
from orion.graph import Graph
from orion.limits import FP16_MAX
from orion.lora.adapter import Placement
from orion.models.blocks import packed_mask_inputs, window_mask_inputs
from orion.models.gemma import graphs
from orion.models.gemma.config import DISPLAY_NAMES, ConfigError, GemmaConfig
from orion.models.gemma.weights import GemmaWeights, load_hf, random_weights
from orion.models.llama.costs import decode_program_costs
from orion.models.llama.lora import lora_placements
from orion.models.llama.model import from_hf_dir, start_decoder
from orion.models.weights_io import table_rows
from orion.quant import head_quant, quant_identity

RESIDUAL_HEADROOM = 2.0  # the scaled stream's bound stays at most FP16_MAX / this (room for rounding)


def residual_scale_for(config: GemmaConfig, weights: GemmaWeights) -> float:
    """The least power of two ``s`` that keeps :func:`orion.models.gemma.graphs.residual_bound` / s within fp16
    (with :data:`RESIDUAL_HEADROOM`): the residual stream divided by it can never overflow."""
    bound = graphs.residual_bound(config, weights) * RESIDUAL_HEADROOM
    return float(2.0 ** max(0, math.ceil(math.log2(bound / FP16_MAX)))) if bound > FP16_MAX else 1.0


class Gemma(CausalLM):
    """A Gemma 2 / Gemma 3 text model compiled for the ANE (or the emulator); see ``orion.models.gemma.graphs``.

    ``context`` caps the KV cache below ``max_position_embeddings``. ``residual_scale``: the power of two the
    residual stream is divided by (exact, see ``orion.models.gemma.graphs``); None (the default) picks the least
    one that the weights prove enough (:func:`residual_scale_for`), 1 runs the stream unscaled. ``quant="int8"``:
    int8 projection and LM-head weights (W8A16, :mod:`orion.quant`); ``imatrix``: an importance matrix
    (:mod:`orion.importance`, or its file) for the lut4/lut6 quantizer."""

    model_type = "gemma2"
    display_name = "Gemma"

    def __init__(self, config: GemmaConfig, weights: GemmaWeights, *, tokenizer: Tokenizer | None = None,
                 tokenizer_error: TokenizerNotFound | None = None, fusion_depth: int | None = None,
                 lm_head: str = "ane", progress: bool = True, context: int | None = None, quant: str = "fp16",
                 profile: str = "hardware", probe_report: Any = None, prefill_chunk: int | None = None,
                 residual_scale: float | None = None, imatrix: Any = None) -> None:
        options = start_decoder(self, "Gemma", config, weights, context, quant, profile, probe_report, ConfigError,
                                imatrix)
        if residual_scale is None:
            residual_scale = residual_scale_for(config, weights)
        if isinstance(residual_scale, bool) or not isinstance(residual_scale, (int, float)) or residual_scale <= 0 \
                or math.log2(residual_scale) != round(math.log2(residual_scale)):
            raise ConfigError(f"Gemma: residual_scale={residual_scale!r}; use a power of two (scaling by one is exact)")
        self.residual_scale = float(residual_scale)
        self.display_name = DISPLAY_NAMES[config.model_type]
        self._setup(tokenizer=tokenizer, tokenizer_error=tokenizer_error, fusion_depth=fusion_depth,
                    lm_head=lm_head, progress=progress, compile_options=options, prefill_chunk=prefill_chunk)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **options: Any) -> Gemma:
        """Load a Hugging Face ``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` directory."""
        return from_hf_dir(cls, path, load_hf, options)

    @classmethod
    def random(cls, config: GemmaConfig, seed: int = 0, **options: Any) -> Gemma:
        """Deterministic random weights of ``config``; no tokenizer."""
        error = TokenizerNotFound("a model with random weights has no tokenizer: pass token ids")
        return cls(config, random_weights(config, seed), tokenizer_error=error, **options)

    # -- hooks of CausalLM ----------------------------------------------------------------------------
    def program_identity(self) -> dict[str, Any]:
        return {"model_type": self.config.model_type, "config": asdict(self.config), "context": self.dims.context,
                "residual_scale": self.residual_scale, "weights": self.weights.content_hash(self.config),
                **quant_identity(self.quant, self.weights.importance)}

    def decode_graph(self, layers: range, adapters: Mapping[str, int] | None = None,
                     context: int | None = None, lanes: int = 1) -> Graph:
        return graphs.decode_graph(self.config, self.weights, layers, context or self.dims.context, adapters,
                                   self.quant, self.residual_scale, lanes)

    def prefill_graph(self, layers: range, seq: int, adapters: Mapping[str, int] | None = None,
                      past: bool = False, context: int | None = None, packed: bool = False) -> Graph:
        return graphs.prefill_graph(self.config, self.weights, layers, seq, adapters, self.quant,
                                    (context or self.dims.context) if past else None, self.residual_scale, packed)

    def lora_placements(self) -> dict[str, Placement]:
        """The Llama family's placements (the same fused qkv / gate_up sites, rotate-half q/k rows)."""
        return lora_placements(self.config)

    def lm_head_graph(self, vocab: range, seq: int) -> Graph:
        return graphs.lm_head_graph(self.config, self.weights, vocab, seq, head_quant(self.quant), self.residual_scale)

    def embed(self, ids: list[int], positions: Sequence[int]) -> np.ndarray:
        """The embedding rows times sqrt(dim) (rounded to float32, as transformers rounds it to the table's dtype),
        divided by the residual scale (a power of two: exact)."""
        rows = table_rows(self.weights.embed, ids, self.weights.source)
        return rows * np.float32(self.config.embed_scale) / np.float32(self.residual_scale)

    def position_inputs(self, positions: range) -> dict[str, np.ndarray]:
        """The decode and chunk graphs' ``rope`` (and Gemma 3's ``rope_local``) inputs: cos then sin."""
        index = np.arange(positions.start, positions.stop)
        return {graphs.ROPE_INPUTS[local]: np.concatenate(graphs.rope_tables(self.config, index, local)).astype(
            np.float32) for local in {False, graphs.uses_local_rope(self.config)}}

    def packed_mask_inputs(self, lengths: Sequence[int], seq: int) -> dict[str, np.ndarray]:
        """``mask_packed``, and ``mask_packed_window`` when a layer has a sliding window."""
        return packed_mask_inputs([self.config.window(i) for i in range(self.config.n_layers)], lengths, seq)

    def mask_inputs(self, positions: range, length: int) -> dict[str, np.ndarray]:
        """The sliding window over the KV cache (``mask_window``)."""
        return window_mask_inputs([self.config.window(i) for i in range(self.config.n_layers)], positions, length)

    def cpu_logits(self, x: np.ndarray) -> np.ndarray:
        """Final norm, LM head and soft-capping in numpy float32 (``x`` divided by the residual scale)."""
        v = x.astype(np.float32)
        eps = np.float32(self.config.rms_norm_eps / self.residual_scale ** 2)
        h = v / np.sqrt(np.mean(v * v) + eps) * (np.float32(1.0) + self.weights.norm)
        logits = self.weights.classifier @ h
        cap = self.config.final_softcap
        return logits if cap is None else (np.float32(cap) * np.tanh(logits / np.float32(cap))).astype(np.float32)

    def layer_weight_bytes(self) -> int:
        return 2 * self.config.layer_param_count()

    def program_costs(self, layer_ranges: list[range], head_ranges: list[range], lm_head: str) -> list[ProgramInfo]:
        return decode_program_costs(self.config, self.dims.context, layer_ranges, head_ranges, lm_head, self.quant)
