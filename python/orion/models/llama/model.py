"""Llama-family models (Llama, Qwen2, Mistral, Qwen3, SmolLM3, Phi-3, llama2.c's Stories) on Orion: the hooks of the
model-independent generation loop (``orion.generation.loop``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from orion.generation.loop import CausalLM, DecoderDims, checked_context
from orion.generation.plan import ProgramInfo
from orion.generation.tokenizer import TOKENIZER_FILE, Tokenizer, TokenizerNotFound, load_tokenizer
from orion.graph import Graph
from orion.importance import attached
from orion.lora.adapter import Placement
from orion.models.blocks import packed_mask_inputs, window_mask_inputs
from orion.models.llama import graphs
from orion.models.llama.config import ConfigError, LlamaConfig, display_name
from orion.models.llama.costs import decode_program_costs
from orion.models.llama.lora import lora_placements
from orion.models.llama.weights import LlamaWeights, load_hf, load_llama2c, random_weights
from orion.models.weights_io import table_matvec, table_rows
from orion.quant import compile_options, head_quant, quant_identity

Model = TypeVar("Model", bound=CausalLM)


class Llama(CausalLM):
    """A Llama-family model compiled for the ANE (or the emulator): RMSNorm, RoPE (either convention),
    grouped-query attention with a KV cache of ``n_kv_heads`` heads, SwiGLU, tied or untied LM head.

    ``context`` caps the KV cache (and the longest sequence) below ``max_position_embeddings``, which
    it defaults to. Beyond it, ``prefill``/``logits`` and ``decode_step`` raise
    :class:`orion.generation.loop.ContextFull` and ``generate`` stops. See
    :class:`orion.generation.loop.CausalLM` for the API and threads. ``quant="int8"``: int8 projection
    and LM-head weights (W8A16, :mod:`orion.quant`), with ``probe_report`` or ``profile="permissive"`` (ANE-35);
    ``imatrix``: an importance matrix (:mod:`orion.importance`, or its file) for the lut4/lut6 quantizer.
    """

    model_type = "llama"
    display_name = "Llama"

    def __init__(self, config: LlamaConfig, weights: LlamaWeights, *, tokenizer: Tokenizer | None = None,
                 tokenizer_error: TokenizerNotFound | None = None, fusion_depth: int | None = None,
                 lm_head: str = "ane", progress: bool = True, context: int | None = None, quant: str = "fp16",
                 profile: str = "hardware", probe_report: Any = None, prefill_chunk: int | None = None,
                 imatrix: Any = None) -> None:
        options = start_decoder(self, "Llama", config, weights, context, quant, profile, probe_report, ConfigError,
                                imatrix)
        self.display_name = display_name(config.model_type)
        self._setup(tokenizer=tokenizer, tokenizer_error=tokenizer_error, fusion_depth=fusion_depth,
                    lm_head=lm_head, progress=progress, compile_options=options, prefill_chunk=prefill_chunk)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **options: Any) -> Llama:
        """Load a Hugging Face directory of a Llama-layer family (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
        ``MistralForCausalLM``, ``Qwen3ForCausalLM``, ``SmolLM3ForCausalLM``, ``Phi3ForCausalLM``: ``config.json``,
        single or sharded safetensors, optionally ``tokenizer.json``); ``progress=False`` silences weight loading too."""
        return from_hf_dir(cls, path, load_hf, options)

    @classmethod
    def from_llama2c(cls, path: str | os.PathLike[str], **options: Any) -> Llama:
        """Load a llama2.c legacy ``.bin`` checkpoint (e.g. ``stories110M.bin``). Text in/out uses a
        ``tokenizer.json`` in the same directory when there is one (llama2.c's own ``tokenizer.bin`` is
        not read), with BOS 1 prepended and EOS 2, as llama2.c's ``run.c`` does, unless its files say otherwise."""
        config, weights = load_llama2c(path)
        directory = Path(path).parent
        if not (directory / TOKENIZER_FILE).is_file():
            error = TokenizerNotFound(f"{path}: no {TOKENIZER_FILE} next to this llama2.c checkpoint (its "
                                      f"tokenizer.bin is not read); pass token ids, or put the model's Hugging "
                                      f"Face {TOKENIZER_FILE} in {directory}")
            return cls(config, weights, tokenizer_error=error, **options)
        defaults = {"bos_token_id": config.bos_token_id, "eos_token_id": list(config.eos_token_ids) or None,
                    "add_bos_token": True}
        return cls(config, weights, tokenizer=load_tokenizer(directory, defaults), **options)

    @classmethod
    def random(cls, config: LlamaConfig | None = None, seed: int = 0, **options: Any) -> Llama:
        """Deterministic random weights of ``config`` (default: the Stories110M shape); no tokenizer."""
        config = config or LlamaConfig.stories110m()
        error = TokenizerNotFound("a model with random weights has no tokenizer: pass token ids, or load a "
                                  "directory with a tokenizer.json via Llama.from_pretrained")
        return cls(config, random_weights(config, seed), tokenizer_error=error, **options)

    # -- hooks of CausalLM ----------------------------------------------------------------------------
    def program_identity(self) -> dict[str, Any]:
        return {"model_type": self.config.model_type, "config": asdict(self.config),
                "context": self.dims.context,  # the decode programs' cache length
                "weights": self.weights.content_hash(self.config),
                **quant_identity(self.quant, self.weights.importance)}

    def decode_graph(self, layers: range, adapters: Mapping[str, int] | None = None,
                     context: int | None = None, lanes: int = 1) -> Graph:
        return graphs.decode_graph(self.config, self.weights, layers, context or self.dims.context, adapters,
                                   self.quant, lanes)

    def prefill_graph(self, layers: range, seq: int, adapters: Mapping[str, int] | None = None,
                      past: bool = False, context: int | None = None, packed: bool = False) -> Graph:
        return graphs.prefill_graph(self.config, self.weights, layers, seq, adapters, self.quant,
                                    (context or self.dims.context) if past else None, packed)

    def packed_mask_inputs(self, lengths: Sequence[int], seq: int) -> dict[str, np.ndarray]:
        """``mask_packed``, and ``mask_packed_window`` when a layer has a sliding window."""
        return packed_mask_inputs([self.config.window(i) for i in range(self.config.n_layers)], lengths, seq)

    def lora_placements(self) -> dict[str, Placement]:
        """``model.layers.<i>.self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj`` on the fused graph sites:
        q rows in query-group order (and, for interleaved RoPE, each head's rows permuted as the weights are),
        o's input columns split by query group."""
        return lora_placements(self.config)

    def lm_head_graph(self, vocab: range, seq: int) -> Graph:
        return graphs.lm_head_graph(self.config, self.weights, vocab, seq, head_quant(self.quant))

    def embed(self, ids: list[int], positions: Sequence[int]) -> np.ndarray:
        return table_rows(self.weights.embed, ids, self.weights.source)  # from the file, not its map (weights_io)

    def position_inputs(self, positions: range) -> dict[str, np.ndarray]:
        """The ``rope`` input of decode and chunk graphs (and of every prefill graph when the tables depend on the
        pass's length: longrope): cos then sin of each position, for a pass ending at ``positions.stop``.

        A longrope pass that continues a cache of positions rotated with the short factors past
        ``original_max_position_embeddings`` is refused: transformers (Phi-3) recomputes the whole sequence
        with the long factors there, which a cache of short-rotated keys cannot give."""
        if graphs.rope_by_length(self.config):
            limit = self.config.rope_scaling.original_max_position_embeddings
            if 0 < positions.start <= limit < positions.stop:
                raise ConfigError(
                    f"{self.display_name}: positions {positions.start}..{positions.stop - 1} cross longrope's "
                    f"original_max_position_embeddings ({limit}) after a pass rotated with its short factors; "
                    "transformers recomputes the whole sequence with the long factors there. Fix: run the whole "
                    "sequence as one prompt (prefill or logits; with prefill_chunk at least its length), which "
                    "rotates every position with the long factors")
        cos, sin = graphs.rope_tables(self.config, np.arange(positions.start, positions.stop))
        return {"rope": np.concatenate([cos, sin]).astype(np.float32)}

    def mask_inputs(self, positions: range, length: int) -> dict[str, np.ndarray]:
        """The sliding window over the KV cache (``mask_window``) when a layer has one."""
        return window_mask_inputs([self.config.window(i) for i in range(self.config.n_layers)], positions, length)

    def cpu_logits(self, x: np.ndarray) -> np.ndarray:
        """Final RMSNorm and LM head in numpy float32."""
        v = x.astype(np.float32)
        h = v / np.sqrt(np.mean(v * v) + np.float32(self.config.rms_norm_eps)) * self.weights.norm
        return table_matvec(self.weights.classifier, h)

    def layer_weight_bytes(self) -> int:
        return 2 * self.config.layer_param_count()

    def program_costs(self, layer_ranges: list[range], head_ranges: list[range], lm_head: str) -> list[ProgramInfo]:
        return decode_program_costs(self.config, self.dims.context, layer_ranges, head_ranges, lm_head, self.quant)


def start_decoder(model: CausalLM, name: str, config: Any, weights: Any, context: int | None, quant: str, profile: str,
                  probe_report: Any, error: type[Exception], imatrix: Any = None) -> dict[str, Any]:
    """The start of a Llama-layer decoder's ``__init__`` (Llama's, Gemma's): validates ``weights`` against
    ``config`` and ``context`` (default ``max_position_embeddings``; else ``error`` naming ``name``), sets
    ``model``'s ``quant``, ``config``, ``weights`` (with ``imatrix``, :func:`orion.importance.attached`) and
    ``dims``; returns the programs' compile options (int8 needs ANE-35 relaxed, :mod:`orion.quant`)."""
    weights.validate(config)
    options = compile_options(quant, profile, probe_report)
    model.quant = quant
    context = checked_context(name, context, config.max_position_embeddings, "max_position_embeddings", error)
    model.config, model.weights = config, weights  # type: ignore[attr-defined]
    model.weights = attached(model, imatrix)  # type: ignore[attr-defined]
    model.dims = DecoderDims(n_layer=config.n_layers, hidden=config.dim, kv_heads=config.n_kv_heads,
                             head_dim=config.head_dim, context=context, vocab_size=config.vocab_size,
                             parameters=config.param_count())
    return options


def from_hf_dir(cls: type[Model], path: str | os.PathLike[str], load: Callable[..., tuple[Any, Any]],
                options: dict[str, Any]) -> Model:
    """``cls`` built from the Hugging Face directory ``path``: its weights by ``load`` (quiet with
    ``progress=False``) and its ``tokenizer.json`` when there is one."""
    config, weights = load(path, progress=None if options.get("progress", True) else False)
    try:
        tokenizer, error = load_tokenizer(path), None
    except TokenizerNotFound as missing:
        tokenizer, error = None, missing
    return cls(config, weights, tokenizer=tokenizer, tokenizer_error=error, **options)  # type: ignore[call-arg]
