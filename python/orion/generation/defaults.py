"""A model's own generation defaults, from its ``generation_config.json`` (as transformers reads it).

``do_sample: false`` (transformers' default) means greedy whatever ``temperature`` says; with
``do_sample: true`` the file's ``temperature``, ``top_k`` (transformers' default 50), ``top_p`` and
``min_p`` apply. ``repetition_penalty`` and ``max_new_tokens`` apply either way. Arguments given to
``generate`` override every default. Settings Orion does not implement (beam search, n-gram bans...)
are reported in one warning when they are not at transformers' defaults, never dropped silently.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orion.generation.hf_files import ModelFileError, read_optional
from orion.generation.sampling import SamplingError, check_sampling
from orion.generation.tokenizer import GENERATION_CONFIG_FILE

HF_TOP_K = 50  # transformers' top_k when do_sample is true and the file names none

# Keys that do not change the tokens chosen, or that Orion reads elsewhere (special token ids).
_INERT = {"transformers_version", "_from_model_config", "bos_token_id", "eos_token_id", "pad_token_id",
          "decoder_start_token_id", "use_cache", "return_dict_in_generate", "output_scores", "output_attentions",
          "output_hidden_states", "output_logits", "max_length", "num_return_sequences",
          "cache_implementation"}  # how transformers lays out its KV cache (Gemma's "hybrid"): same tokens
# Unimplemented settings and the value at which they do nothing (transformers' defaults).
_NEUTRAL = {"num_beams": 1, "num_beam_groups": 1, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
            "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0,
            "length_penalty": 1.0, "penalty_alpha": None, "bad_words_ids": None, "force_words_ids": None,
            "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
            "forced_eos_token_id": None, "min_length": 0, "min_new_tokens": None, "exponential_decay_length_penalty":
            None, "guidance_scale": None, "sequence_bias": None, "top_a": None, "early_stopping": False}
_READ = {"do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens"}


class GenerationConfigWarning(UserWarning):
    """``generation_config.json`` asks for a setting Orion does not implement."""


@dataclass(frozen=True)
class GenerationDefaults:
    """What ``generate`` uses for arguments left at None. The empty defaults are greedy, no penalty."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    source: str = "Orion's defaults (greedy)"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> GenerationDefaults:
        """Defaults from the contents of a ``generation_config.json`` (``where`` names it in errors)."""
        sample = bool(data.get("do_sample", False))
        values = {
            "temperature": float(data.get("temperature", 1.0) or 0.0) if sample else 0.0,
            "top_k": (data.get("top_k", HF_TOP_K) or None) if sample else None,
            "top_p": data.get("top_p") if sample and data.get("top_p") not in (None, 1, 1.0) else None,
            "min_p": data.get("min_p") if sample else None,
            "repetition_penalty": data.get("repetition_penalty"),
            "max_new_tokens": data.get("max_new_tokens"),
        }
        try:
            check_sampling(values["temperature"], values["top_k"], values["top_p"], values["min_p"],
                           values["repetition_penalty"])
        except SamplingError as err:
            raise ModelFileError(f"{where}: {err}") from None
        n = values["max_new_tokens"]
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ModelFileError(f"{where}: max_new_tokens={n!r}: use a non-negative integer")
        ignored = {k: v for k, v in data.items()
                   if k not in _INERT | _READ and (k not in _NEUTRAL or v != _NEUTRAL[k])}
        if ignored:
            warnings.warn(f"{where}: Orion does not implement {ignored}; generation uses Orion's sampling "
                          f"(temperature, top_k, top_p, min_p, repetition_penalty) without them",
                          GenerationConfigWarning, stacklevel=3)
        return cls(**values, source=where)

    @classmethod
    def from_directory(cls, directory: str | Path) -> GenerationDefaults:
        """The defaults of a model directory (Orion's own without a ``generation_config.json``)."""
        directory = Path(directory)
        data = read_optional(directory, GENERATION_CONFIG_FILE)
        return cls.from_dict(data, str(directory / GENERATION_CONFIG_FILE)) if data else cls()
