"""The model a full training run ends with, as a Hugging Face directory (``RUN_DIR/model``): ``config.json``,
``model.safetensors`` (the fp32 master weights, or another dtype) and the tokenizer the run's ids came from, so that
``python -m orion generate``/``serve``, :func:`orion.models.load` and transformers read it as any other model.

A fine-tune of a model directory keeps that directory's tokenizer, chat template and generation settings, and its
``config.json`` fields Orion does not model (token ids, ``architectures``); a model trained from a shape gets the
tokenizer of its token data (``data prepare``'s ``tokenizer.json``), when the data has one."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from orion.autodiff.trainable import TrainableModel
from orion.generation.hf_files import CONFIG_FILE, read_json_object
from orion.models import family_of

# The files of a model directory that describe its tokenizer and generation (everything but config and weights).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt")


def save_model(model: TrainableModel, params: Mapping[str, np.ndarray], path: str | os.PathLike[str], *,
               base_dir: str | os.PathLike[str] | None = None, tokenizer_file: str | os.PathLike[str] | None = None,
               dtype: str = "float32") -> Path:
    """Write ``model``'s weights ``params`` (a trainer's flat parameters) to the Hugging Face directory ``path``
    in ``dtype``, with ``base_dir``'s tokenizer files and extra config fields (a fine-tune), else
    ``tokenizer_file`` as ``tokenizer.json`` (if given); ``dtype`` is one of ``weights_io.SAVE_DTYPES`` (the family's
    save_hf refuses another before writing). The directory is written beside ``path`` and then
    put in its place, so ``path`` never holds half a model. Returns ``path``."""
    path = Path(path)
    staging = path.with_name(path.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    family_of(model.config).weights.save_hf(staging, model.config, model.weights(dict(params)), dtype=dtype)
    config = read_json_object(staging / CONFIG_FILE) | {"dtype": dtype}
    if base_dir is not None:
        base = Path(base_dir)
        base_config = read_json_object(base / CONFIG_FILE)
        config = base_config | config | ({"torch_dtype": dtype} if "torch_dtype" in base_config else {})
        for name in TOKENIZER_FILES:
            if (base / name).is_file():
                shutil.copyfile(base / name, staging / name)
    elif tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, staging / "tokenizer.json")
    (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)
    return path
