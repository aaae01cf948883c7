"""Which ``config.json`` fields change a model: the one policy every family's config reader applies.

Each family lists, explicitly, the fields that change its model (the fields transformers' own class
for that family reads in its forward pass). Its reader implements each of them, or refuses a value
it does not implement with an error naming the field; none is ignored.

Every other field cannot change the model, because the family's model never reads it (transformers
does not either): it is accepted. Fields known to be bookkeeping (:data:`INERT_FIELDS`: transformers'
execution settings, generation defaults, other runtimes' metadata, token ids the tokenizer reads) are
accepted silently; any other gets one :class:`ConfigNote` naming them all, so a new bookkeeping
field on the Hub never stops a model from loading.

``quantization_config`` is in every family's list: quantized weights are a different model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orion.progress import warn_user

# Fields that every family reads (the weights' own format); a family's list includes them.
COMMON_MODEL_FIELDS = frozenset({"model_type", "architectures", "vocab_size", "tie_word_embeddings",
                                 "quantization_config"})

# Fields known not to change any model's outputs, with the reason (the note skips them).
INERT_FIELDS: dict[str, str] = {
    **dict.fromkeys(("_name_or_path", "_model_name_or_path", "_commit_hash", "transformers_version", "torch_dtype",
                     "dtype", "id2label", "label2id", "_num_labels", "num_labels", "problem_type", "finetuning_task",
                     "tokenizer_class", "prefix", "task_specific_params", "_attn_implementation_autoset",
                     "model_name", "auto_map", "base_model_name_or_path", "custom_pipelines"),
                    "transformers' bookkeeping"),
    **dict.fromkeys(("transformers.js_config", "transformers_js_config", "mlx_config", "quantization_info",
                     "gguf_file", "unsloth_version", "unsloth_fixed"),
                    "another runtime's or tool's metadata"),
    **dict.fromkeys(("use_cache", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
                     "chunk_size_feed_forward", "pruned_heads", "pretraining_tp", "_attn_implementation",
                     "use_bfloat16", "xla_device", "gradient_checkpointing", "output_past", "keys_to_ignore_at_inference",
                     "cache_implementation"),
                    "a transformers execution setting, same outputs"),
    **dict.fromkeys(("initializer_range", "attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop",
                     "attn_pdrop", "summary_first_dropout", "layerdrop", "dropout"),
                    "training only (initialization, dropout)"),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id",
                     "decoder_start_token_id"),
                    "a token id (the tokenizer's and generation's, not the network's)"),
    **dict.fromkeys(("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
                     "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
                     "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                     "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
                     "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
                     "suppress_tokens", "begin_suppress_tokens", "tf_legacy_loss", "is_decoder",
                     "is_encoder_decoder", "add_cross_attention", "cross_attention_hidden_size",
                     "tie_encoder_decoder"), "a generation default or an encoder-decoder setting"),
    **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels"),
                    "the sequence-summary head of GPT2DoubleHeadsModel, not the causal LM"),
    **dict.fromkeys(("n_special", "predict_special_tokens"),
                    "GPT-1 era fields that transformers' GPT-2 does not read"),
    **dict.fromkeys(("rope_interleaved", "is_llama_config"), "nanotron bookkeeping that transformers ignores too"),
}


class ConfigNote(UserWarning):
    """A ``config.json`` holds fields that the family's model does not read; they were accepted and not used."""


def note_unread_fields(data: Mapping[str, Any], where: str, family: str, model_fields: Iterable[str]) -> list[str]:
    """Issue one :class:`ConfigNote` naming the fields of ``data`` that are neither in the family's
    ``model_fields`` nor known bookkeeping; returns them (sorted)."""
    unread = sorted(set(data) - set(model_fields) - set(INERT_FIELDS))
    if unread:
        warn_user(f"{where}: {', '.join(map(repr, unread))} {'is' if len(unread) == 1 else 'are'} not among the "
                  f"fields that change a {family} model, so accepted and not used", ConfigNote)
    return unread
