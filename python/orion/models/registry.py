"""The model registry: which class runs a ``config.json``'s ``model_type``, and named random shapes.

Adding a model is one :func:`register` call (its class and config class, its trainable and weights
module, and the ``model_type`` values it runs); adding a named random shape is one :func:`register_shape` call, and a checkpoint
file format (a file rather than a directory, by suffix) one :func:`register_file_format` call. A
model class provides ``model_type``, ``from_pretrained(path, **options)`` and
``random(config, seed, **options)``; its config class provides ``param_count()``; its trainable
(``orion.autodiff.trainable.TrainableModel``, built from a config) is what the trainer, LoRA fine-tuning
and the training bench use, and its weights module provides ``load_hf(path)``, ``save_hf(path, config,
weights)`` and ``random_weights(config, seed)``.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from orion.errors import OrionError
from orion.generation.defaults import GenerationDefaults
from orion.generation.hf_files import CONFIG_FILE, ModelFileError, read_json_object


class UnknownModel(OrionError, ValueError):
    """No registered model runs this ``model_type``, shape name or config."""


class UnknownOption(OrionError, TypeError):
    """``load`` or ``random`` was given an option the model's class does not take."""


# Keyword-only parameters of a model class's constructor that its loaders fill in themselves.
_LOADER_OPTIONS = frozenset({"tokenizer", "tokenizer_error"})


def check_options(model: type, options: Iterable[str], source: str) -> None:
    """Refuses, before any weight is read, an option ``model``'s constructor does not take (a misspelt
    ``progres=``), naming the options it does take and the closest one."""
    accepted = {name for name, p in inspect.signature(model.__init__).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY} - _LOADER_OPTIONS
    unknown = sorted(set(options) - accepted)
    if unknown:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownOption(f"{source}: {model.__name__} takes no option {unknown[0]!r}. Fix: {hint}its options are "
                            f"{', '.join(sorted(accepted))}")


@dataclass(frozen=True)
class Family:
    """A registered model: its class, its config class, its trainable class (made from a config) and the
    module that loads, saves and makes its weights (``load_hf``, ``save_hf``, ``random_weights``)."""

    model: type
    config: type
    trainable: type
    weights: ModuleType


_FAMILIES: dict[str, Family] = {}
_SHAPES: dict[str, Any] = {}
_FILE_FORMATS: dict[str, Callable[..., Any]] = {}
_FILE_CLASSES: dict[str, Callable[[Path], type]] = {}
_FILE_TOKENIZERS: dict[str, Callable[[Path], Any]] = {}


def register(model: type, config: type, trainable: type, weights: ModuleType,
             model_types: Iterable[str] | None = None) -> None:
    """Make ``model`` the class that runs configs of each of ``model_types`` (default: its ``model_type``),
    ``trainable`` the one that trains them and ``weights`` the module that reads and writes their weights."""
    for model_type in model_types or (model.model_type,):
        _FAMILIES[model_type] = Family(model, config, trainable, weights)


def register_file_format(suffix: str, load_file: Callable[..., Any], class_of: Callable[[Path], type] | None = None,
                         tokenizer_of: Callable[[Path], Any] | None = None) -> None:
    """Make ``load_file(path, **options)`` the loader of checkpoint files ending in ``suffix`` (e.g. ``".bin"``);
    ``class_of(path)`` tells the class a file loads as without reading its weights (default: the class whose
    classmethod ``load_file`` is), ``tokenizer_of(path)`` the tokenizer the file holds (None: it holds none)."""
    _FILE_FORMATS[suffix] = load_file
    _FILE_CLASSES[suffix] = class_of or (lambda path: load_file.__self__)
    if tokenizer_of is not None:
        _FILE_TOKENIZERS[suffix] = tokenizer_of


def file_suffixes() -> list[str]:
    """The suffixes of the checkpoint files :func:`load` reads (besides directories)."""
    return sorted(_FILE_FORMATS)


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of a model directory (its ``tokenizer.json``) or of a checkpoint file that holds one
    (a ``.gguf``), read without the weights: the check to make before a slow load and compile."""
    path = Path(path)
    if _checkpoint_file(path) and path.suffix in _FILE_TOKENIZERS:
        return _FILE_TOKENIZERS[path.suffix](path)
    from orion.generation.tokenizer import load_tokenizer as load_directory_tokenizer

    return load_directory_tokenizer(path.parent if _checkpoint_file(path) else path)


def register_shape(name: str, config: Any) -> None:
    """Name a config of a registered model for :func:`random` (e.g. ``"gpt2"``, ``"124m"``)."""
    family_of(config)
    _SHAPES[name] = config


def model_types() -> list[str]:
    """The ``model_type`` values :func:`load` accepts."""
    return sorted(_FAMILIES)


def shape_names() -> list[str]:
    """The names :func:`random` accepts."""
    return sorted(_SHAPES)


def family(model_type: str, where: str = "config.json") -> Family:
    """The registered family that runs ``model_type`` (``where``: the file that names it, for the error)."""
    if model_type not in _FAMILIES:
        what = "has no model_type" if model_type is None else f"has model_type {model_type!r}"
        raise UnknownModel(f"{where}: {what}; Orion runs model types {model_types()}")
    return _FAMILIES[model_type]


def family_of(config: Any) -> Family:
    """The registered family whose config class ``config`` is."""
    for family in _FAMILIES.values():
        if isinstance(config, family.config):
            return family
    raise UnknownModel(f"{type(config).__name__} is not the config of a registered model "
                       f"(registered: {model_types()}); register the model with orion.models.register")


_CONTEXT_KEYS = ("n_positions", "n_ctx", "max_position_embeddings")  # Hugging Face names of the context length


def _checkpoint_file(path: Path) -> bool:
    return path.is_file() and path.suffix in _FILE_FORMATS


def context_length(source: str | os.PathLike[str] | Any) -> int | None:
    """The context length a model directory's ``config.json`` (or a registered shape name, or a
    config) declares, read without building the model; None when it names none (or ``source`` is a
    checkpoint file, whose header is read at load)."""
    if isinstance(source, str) and source in _SHAPES:
        source = _SHAPES[source]
    if isinstance(source, (str, os.PathLike)):
        if _checkpoint_file(Path(source)):
            return None
        data = read_json_object(Path(source) / CONFIG_FILE)
    else:  # a config's own field (not its to_hf_json, which refuses configs no checkpoint holds: llama2.c's RoPE)
        data = {k: getattr(source, k, None) for k in _CONTEXT_KEYS}
    values = [data[k] for k in _CONTEXT_KEYS if isinstance(data.get(k), int)]
    return values[0] if values else None


def model_class(path: str | os.PathLike[str]) -> type:
    """The registered class that runs ``path``: a Hugging Face directory (by ``config.json``'s
    ``model_type``) or a checkpoint file of a registered format; checked without reading the weights."""
    directory = Path(path)
    if _checkpoint_file(directory):
        return _FILE_CLASSES[directory.suffix](directory)
    if not directory.is_dir():
        what = "a file, not a directory" if directory.exists() else "no such directory"
        formats = "".join(f", or a {suffix} file" for suffix in sorted(_FILE_FORMATS))
        raise ModelFileError(f"{directory}: {what}; give a Hugging Face model directory "
                             f"(config.json and model.safetensors){formats}")
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        run = f". Fix: {directory} is a training run; its trained model is {directory / 'model'}" \
            if (directory / "model" / CONFIG_FILE).is_file() else ""
        raise ModelFileError(f"{config_path}: no such file; a model directory holds the model's Hugging Face "
                             f"{CONFIG_FILE} (its model_type picks the model) and weights{run}")
    return family(read_json_object(config_path).get("model_type"), str(config_path)).model


def load(path: str | os.PathLike[str], **options: Any) -> Any:
    """The model in Hugging Face directory ``path``, by its ``config.json``'s ``model_type``, with the
    sampling defaults of its ``generation_config.json``; or in a checkpoint file of a registered format
    (by its suffix, e.g. a llama2.c ``.bin``)."""
    path = Path(path)
    cls = model_class(path)
    check_options(cls, options, f"load({str(path)!r})")
    if _checkpoint_file(path):
        return _FILE_FORMATS[path.suffix](path, **options)
    model = cls.from_pretrained(path, **options)
    if "generation_defaults" not in vars(model):  # a family whose from_pretrained does not read them
        model.generation_defaults = GenerationDefaults.from_directory(path)
    return model


def random(shape: str | Any, seed: int = 0, **options: Any) -> Any:
    """A model with deterministic random weights: ``shape`` is a registered name (see
    :func:`shape_names`) or a config of a registered model."""
    config = _shape_config(shape)
    model = family_of(config).model
    check_options(model, options, "random()")
    return model.random(config, seed=seed, **options)


def save_random(shape: str | Any, path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Writes :func:`random`'s weights of ``shape`` to ``path`` as a Hugging Face directory (``config.json``
    and fp16 safetensors, no tokenizer): a checkpoint to :func:`load` as a user's, with the same values."""
    config = _shape_config(shape)
    weights = family_of(config).weights
    weights.save_hf(path, config, weights.random_weights(config, seed), dtype="float16")
    return Path(path)


def _shape_config(shape: str | Any) -> Any:
    if not isinstance(shape, str):
        return shape
    if shape not in _SHAPES:
        raise UnknownModel(f"no random shape named {shape!r}; the registered shapes are {shape_names()}")
    return _SHAPES[shape]
