"""GPT-2 on Orion: the hooks of the model-independent generation loop (``orion.generation.loop``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orion.generation.defaults import GenerationDefaults
from orion.generation.loop import CausalLM, DecoderDims, checked_context
from orion.generation.plan import ProgramInfo
from orion.generation.tokenizer import Tokenizer, TokenizerNotFound, load_tokenizer
from orion.graph import Graph
from orion.importance import attached
from orion.lora.adapter import Placement, Site
from orion.models.gpt2 import graphs
from orion.models.gpt2.config import ConfigError, GPT2Config
from orion.models.gpt2.costs import decode_program_costs, layer_params
from orion.models.gpt2.weights import GPT2Weights, load_hf, random_weights
from orion.models.weights_io import table_matvec, table_rows
from orion.quant import compile_options, head_quant, quant_identity


class GPT2(CausalLM):
    """A GPT-2 model (any GPT-2-family size) compiled for the ANE (or the emulator).

    See :class:`orion.generation.loop.CausalLM` for ``prefill``, ``decode_step``, ``logits``,
    ``generate``, ``generate_text`` and ``fork``, and for which objects are thread-safe.
    ``quant="int8"`` stores the projection and LM-head weights as int8 with per-output-channel scales
    (W8A16, :mod:`orion.quant`); it needs ``probe_report`` or ``profile="permissive"`` (ANE-35). ``imatrix``: an
    importance matrix (:mod:`orion.importance`, or its file) for the lut4/lut6 quantizer.
    """

    model_type = "gpt2"
    display_name = "GPT-2"

    def __init__(self, config: GPT2Config, weights: GPT2Weights, *, tokenizer: Tokenizer | None = None,
                 tokenizer_error: TokenizerNotFound | None = None, fusion_depth: int | None = None,
                 lm_head: str = "ane", progress: bool = True, context: int | None = None, quant: str = "fp16",
                 profile: str = "hardware", probe_report: Any = None, prefill_chunk: int | None = None,
                 imatrix: Any = None) -> None:
        weights.validate(config)
        self.config, self.weights = config, weights
        options = compile_options(quant, profile, probe_report)  # int8 needs ANE-35 relaxed (orion.quant)
        self.quant = quant
        self.weights = attached(self, imatrix)  # the lut4/lut6 quantizer's importance matrix (orion.importance)
        context = checked_context("GPT-2", context, config.n_positions, "n_positions", ConfigError)
        self.dims = DecoderDims(n_layer=config.n_layer, hidden=config.n_embd, kv_heads=config.n_head,
                                head_dim=config.head_dim, context=context,
                                vocab_size=config.vocab_size, parameters=config.param_count())
        self._setup(tokenizer=tokenizer, tokenizer_error=tokenizer_error, fusion_depth=fusion_depth,
                    lm_head=lm_head, progress=progress, compile_options=options, prefill_chunk=prefill_chunk)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **options: Any) -> GPT2:
        """Load a Hugging Face GPT-2 directory (``config.json``, ``model.safetensors``, optionally
        ``tokenizer.json`` and ``generation_config.json``); ``progress=False`` silences weight loading too."""
        config, weights = load_hf(path, progress=None if options.get("progress", True) else False)
        try:
            tokenizer, error = load_tokenizer(path), None
        except TokenizerNotFound as missing:
            tokenizer, error = None, missing
        defaults = GenerationDefaults.from_directory(path)
        model = cls(config, weights, tokenizer=tokenizer, tokenizer_error=error, **options)
        model.generation_defaults = defaults
        return model

    @classmethod
    def random(cls, config: GPT2Config | None = None, seed: int = 0, **options: Any) -> GPT2:
        """Deterministic random weights of ``config`` (default: the 124M shape); no tokenizer."""
        config = config or GPT2Config()
        error = TokenizerNotFound("a model with random weights has no tokenizer: pass token ids, or load a "
                                  "directory with a tokenizer.json via GPT2.from_pretrained")
        return cls(config, random_weights(config, seed), tokenizer_error=error, **options)

    # -- hooks of CausalLM ----------------------------------------------------------------------------
    def program_identity(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "config": self.config.to_hf_json(),
                "weights": self.weights.content_hash(self.config),
                **quant_identity(self.quant, self.weights.importance)}

    def decode_graph(self, layers: range, adapters: Mapping[str, int] | None = None,
                     context: int | None = None, lanes: int = 1) -> Graph:
        return graphs.decode_graph(self.config, self.weights, layers, adapters, self.quant, context, lanes)

    def prefill_graph(self, layers: range, seq: int, adapters: Mapping[str, int] | None = None,
                      past: bool = False, context: int | None = None, packed: bool = False) -> Graph:
        return graphs.prefill_graph(self.config, self.weights, layers, seq, adapters, self.quant, past, context,
                                    packed)

    peft_fan_in_fan_out = True  # Hugging Face GPT-2's projections are Conv1D ([in, out] weights)

    def lora_placements(self) -> dict[str, Placement]:
        """``transformer.h.<i>.{attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj}``, each one whole site."""
        c, f = self.config.n_embd, self.config.inner
        shapes = {"attn.c_attn": (c, 3 * c), "attn.c_proj": (c, c), "mlp.c_fc": (c, f), "mlp.c_proj": (f, c)}
        placements = {}
        for i in range(self.config.n_layer):
            for module, site in graphs.lora_site_names(i).items():
                fan_in, fan_out = shapes[module]
                placements[f"transformer.h.{i}.{module}"] = Placement(Site(site, fan_out, (fan_in,)), fan_in, fan_out,
                                                                      slice(0, fan_out))
        return placements

    def lm_head_graph(self, vocab: range, seq: int) -> Graph:
        return graphs.lm_head_graph(self.config, self.weights, vocab, seq, head_quant(self.quant))

    def embed(self, ids: list[int], positions: Sequence[int]) -> np.ndarray:
        w = self.weights  # rows read from the checkpoint file, not through its map (weights_io.table_rows)
        return table_rows(w.wte, ids, w.source) + table_rows(w.wpe, positions, w.source)

    def cpu_logits(self, x: np.ndarray) -> np.ndarray:
        """Final LayerNorm and tied LM head in numpy float32."""
        v = x.astype(np.float32)
        h = (v - v.mean()) / np.sqrt(v.var() + self.config.layer_norm_epsilon)
        h = h * self.weights.ln_f_g + self.weights.ln_f_b
        return table_matvec(self.weights.wte, h)

    def layer_weight_bytes(self) -> int:
        return 2 * layer_params(self.config)

    def program_costs(self, layer_ranges: list[range], head_ranges: list[range], lm_head: str) -> list[ProgramInfo]:
        return decode_program_costs(self.config, layer_ranges, head_ranges, lm_head, self.quant)
