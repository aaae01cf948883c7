"""Decoder weights in Hugging Face directories, shared by the Llama-layer and Gemma families: the weights
container both families subclass (arrays by Orion name, validation against a config, content hash), the
loader that reads a directory's safetensors through a family's tensor-name map (every tensor checked for
name, shard, dtype and shape, with errors naming the file, the tensor and the fix), and the writer.

A family supplies a :class:`Checkpoint`: its Hugging Face tensor name -> (Orion field, layer) map for one
config, the shape of each field and how to describe the config in errors."""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from safetensors import SafetensorError, safe_open

from orion.errors import OrionError
from orion.generation.hf_files import CONFIG_FILE
from orion.importance import Importance
from orion.models.weights_io import (
    INDEX_FILE,
    PROGRESS_EVERY,
    PROGRESS_MIN_BYTES,
    SAVE_DTYPES,
    WEIGHTS_FILE,
    MappedSafetensors,
    WeightsSource,
    check_weight_shapes,
    content_hash,
    safetensors_files,
    write_safetensors,
)

READ_DTYPES = {"F16", "BF16", "F32", "F64"}
# Orion field -> Hugging Face name of the arrays outside the layers (the same in every family here).
TOP_NAMES: dict[str, str] = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                             "lm_head": "lm_head.weight"}
_DIMS = {"embed": "vocab_size, dim", "lm_head": "vocab_size, dim", "wq": "n_heads*head_dim, dim",
         "wk": "n_kv_heads*head_dim, dim", "wv": "n_kv_heads*head_dim, dim", "bq": "n_heads*head_dim",
         "bk": "n_kv_heads*head_dim", "bv": "n_kv_heads*head_dim", "wo": "dim, n_heads*head_dim",
         "w_gate": "hidden_dim, dim", "w_up": "hidden_dim, dim", "w_down": "dim, hidden_dim",
         "q_norm": "head_dim", "k_norm": "head_dim", "qkv": "(n_heads+2*n_kv_heads)*head_dim, dim",
         "gate_up": "2*hidden_dim, dim"}

Layer = TypeVar("Layer")
Names = dict[str, tuple[str, int | None]]  # Hugging Face tensor name -> (Orion field, layer index or None)


@dataclass
class DecoderWeights(Generic[Layer]):
    """A decoder's weights: ``lm_head`` is None when tied to ``embed``; ``layers`` are a family's layer
    dataclass; ``source``: the checkpoint they were loaded from (None for weights made in memory); ``importance``:
    the importance matrix their LUT quantizer weights its k-means by (a model's ``imatrix`` option).
    A subclass names its ``HASH_TAG`` and the optional layer fields present exactly when a config flag is
    true (``OPTIONAL``: field -> flag)."""

    HASH_TAG: ClassVar[str]
    OPTIONAL: ClassVar[dict[str, str]] = {}

    embed: np.ndarray
    norm: np.ndarray
    layers: list[Layer]
    lm_head: np.ndarray | None = None
    source: WeightsSource | None = field(default=None, repr=False, compare=False)
    importance: Importance | None = field(default=None, repr=False, compare=False)

    @property
    def classifier(self) -> np.ndarray:
        """The LM head matrix ``[vocab, dim]`` (``embed`` when tied)."""
        return self.embed if self.lm_head is None else self.lm_head

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every stored array with its Orion name (``embed``, ``layers.0.wq``, ...), in a fixed order."""
        yield "embed", self.embed
        yield "norm", self.norm
        if self.lm_head is not None:
            yield "lm_head", self.lm_head
        for i, layer in enumerate(self.layers):
            for f in fields(layer):  # type: ignore[arg-type]
                array = getattr(layer, f.name)
                if array is not None:
                    yield f"layers.{i}.{f.name}", array

    def validate(self, config: Any) -> None:
        """Raise the family's error unless these arrays fit ``config`` (a subclass calls :meth:`check`)."""
        raise NotImplementedError(f"{type(self).__name__} does not define validate")

    def check(self, config: Any, shapes: dict[str, tuple[int, ...]], error: type[OrionError]) -> None:
        """Raise ``error`` unless the layer count, the LM head (present exactly when untied), the
        ``OPTIONAL`` fields and every array's dtype and shape (``shapes``) match ``config``."""
        owner = type(self).__name__
        if len(self.layers) != config.n_layers:
            raise error(f"{owner} has {len(self.layers)} layers, config.n_layers is {config.n_layers}")
        if (self.lm_head is None) != config.tie_embeddings:
            raise error(f"{owner}.lm_head is {'absent' if self.lm_head is None else 'present'} but "
                        f"config.tie_embeddings is {config.tie_embeddings}")
        for i, layer in enumerate(self.layers):
            for name, flag in self.OPTIONAL.items():
                wanted = getattr(config, flag)
                if (getattr(layer, name) is None) == wanted:
                    raise error(f"{owner}.layers.{i}.{name} is {'absent' if wanted else 'present'} "
                                f"but config.{flag} is {wanted}")
        check_weight_shapes(owner, self.arrays(), shapes, error)

    def content_hash(self, config: Any) -> str:
        """sha256 (hex) of ``config`` and every array's name, shape and raw bytes (the checkpoint files'
        digest standing for the bytes while the arrays are the loaded ones), after :meth:`validate`."""
        self.validate(config)
        return content_hash(self.HASH_TAG, repr(config), self.arrays(), self.source)

    def by_hf_name(self, names: Names, get: Callable[[Any, str], np.ndarray] = getattr) -> dict[str, np.ndarray]:
        """The array of every Hugging Face tensor in ``names``; ``get(owner, field)`` reads one field of this
        object (top-level fields) or of a layer."""
        return {hf: get(self if layer is None else self.layers[layer], ours) for hf, (ours, layer) in names.items()}


@dataclass(frozen=True)
class Checkpoint:
    """What one family's checkpoint of one config must hold, for :func:`load_hf_dir`.

    ``names``: every stored tensor (a tied LM head left out); ``shapes``: of each Orion field; ``about``: the
    config as errors describe it (``llama config (n_layers=2, tied: True)``); ``ignored``: name endings of
    tensors to skip; ``float32``: load as float32 copies rather than at the stored precision."""

    config: Any
    names: Names
    shapes: dict[str, tuple[int, ...]]
    about: str
    error: type[OrionError]
    help: str
    ignored: tuple[str, ...] = ()
    float32: bool = False


def hf_names(n_layers: int, tied: bool, layer_names: dict[str, str], keep: Callable[[str], bool]) -> Names:
    """The :data:`TOP_NAMES` (``lm_head`` only when untied) and, for each layer, ``layer_names`` (Orion field ->
    name under ``model.layers.N.``) of the fields ``keep`` accepts."""
    names: Names = {hf: (ours, None) for ours, hf in TOP_NAMES.items() if ours != "lm_head" or not tied}
    for i in range(n_layers):
        names.update({f"model.layers.{i}.{hf}": (ours, i) for ours, hf in layer_names.items() if keep(ours)})
    return names


def shape_detail(config: Any, field: str) -> str:
    """How ``config`` implies the shape of Orion field ``field`` (for shape errors)."""
    return (f"[{_DIMS.get(field, 'dim')}] with dim={config.dim}, n_heads={config.n_heads}, "
            f"n_kv_heads={config.n_kv_heads}, head_dim={config.head_dim}, hidden_dim={config.hidden_dim}, "
            f"vocab_size={config.vocab_size}")


def load_hf_dir(directory: Path, spec: Checkpoint,
                progress: bool | None) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]], list[MappedSafetensors]]:
    """Read the safetensors of ``directory`` as ``spec`` says: (top-level arrays, each layer's arrays, by Orion
    field; the files' maps). Every stored tensor must be in ``spec.names`` (except ``spec.ignored``), listed for
    its shard, F32/F16/BF16 and of its field's shape; a tied checkpoint may store ``lm_head.weight`` only if it
    equals the embedding. ``progress``: a line to stderr every few tensors (None: only for at least 64 MiB)."""
    config, error, expected, shapes = spec.config, spec.error, spec.names, spec.shapes
    shards = safetensors_files(directory, error, spec.help)
    if progress is None:
        progress = sum(f.stat().st_size for f in shards) >= PROGRESS_MIN_BYTES
    found: dict[str, np.ndarray] = {}
    where: dict[str, Path] = {}
    mapped: list[MappedSafetensors] = []
    count = 0
    for file, listed in shards.items():
        try:
            handle = safe_open(str(file), framework="np")
            mapped.append(MappedSafetensors(file))
        except (SafetensorError, OSError, ValueError, struct.error) as exc:
            raise error(f"{file}: not a readable safetensors file ({exc})") from exc
        with handle as f:
            keys = sorted(f.keys())
            absent = sorted((listed or set()) - set(keys))
            if absent:
                raise error(f"{directory / INDEX_FILE}: lists tensor {absent[0]!r} in {file.name}, which lacks it")
            for key in keys:
                if key.endswith(spec.ignored):
                    continue
                if listed is not None and key not in listed:
                    raise error(f"{file}: tensor {key!r} is not listed for this shard in {INDEX_FILE}")
                tied_head = key == TOP_NAMES["lm_head"] and config.tie_embeddings
                if key not in expected and not tied_head:
                    raise error(f"{file}: unexpected tensor {key!r}: not a weight of this {spec.about}; "
                                f"is {CONFIG_FILE} the checkpoint's own?")
                if key in where:
                    raise error(f"{file}: tensor {key!r} is stored twice (also in {where[key]})")
                where[key] = file
                ours = "lm_head" if tied_head else expected[key][0]
                stored = f.get_slice(key)
                dtype, shape = stored.get_dtype(), tuple(stored.get_shape())
                if dtype not in READ_DTYPES:
                    raise error(f"{file}: tensor {key!r} has dtype {dtype}; expected F32, F16 or BF16")
                if shape != shapes[ours]:
                    raise error(f"{file}: tensor {key!r} has shape {shape}, expected {shapes[ours]} "
                                f"({shape_detail(config, ours)} from {CONFIG_FILE})")
                found[key] = mapped[-1].float32(key) if spec.float32 else mapped[-1].array(key)
                count += 1
                if progress and count % PROGRESS_EVERY == 0:
                    print(f"orion: loading {directory.name}: {count} tensors", file=sys.stderr, flush=True)
    missing = [name for name in expected if name not in found]
    if missing:
        raise error(f"{directory}: missing tensor {missing[0]!r}"
                    + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                    + f" that {CONFIG_FILE} implies ({config.model_type}, tied: {config.tie_embeddings})")
    if config.tie_embeddings and TOP_NAMES["lm_head"] in found and \
            not np.array_equal(found.pop(TOP_NAMES["lm_head"]), found[TOP_NAMES["embed"]]):
        raise error(f"{where[TOP_NAMES['lm_head']]}: 'lm_head.weight' differs from 'model.embed_tokens.weight' "
                    f"but {CONFIG_FILE} has tie_word_embeddings=true. Fix: set it to false")
    if progress:
        print(f"orion: loaded {directory.name}: {count} tensors", file=sys.stderr, flush=True)
    top: dict[str, np.ndarray] = {}
    layers: list[dict[str, np.ndarray]] = [{} for _ in range(config.n_layers)]
    for hf, (ours, layer) in expected.items():
        (top if layer is None else layers[layer])[ours] = found[hf]
    return top, layers, mapped


def attach_source(weights: DecoderWeights[Any], mapped: list[MappedSafetensors]) -> None:
    """Record the files ``weights`` were just loaded from, and drop the pages the load read."""
    weights.source = WeightsSource(mapped, dict(weights.arrays()))
    weights.source.release_pages()  # the lm_head comparison read pages


def save_hf_dir(path: str | os.PathLike[str], meta: dict[str, Any], tensors: dict[str, np.ndarray], dtype: str,
                error: type[OrionError], max_shard_bytes: int | None = None) -> None:
    """Write ``config.json`` (``meta`` plus ``dtype``) and ``tensors`` as ``model.safetensors`` in ``dtype`` (a
    :data:`SAVE_DTYPES` name), or with ``max_shard_bytes`` as shards plus ``model.safetensors.index.json``."""
    if dtype not in SAVE_DTYPES:
        raise error(f"save_hf: dtype {dtype!r} is not one of {', '.join(SAVE_DTYPES)}")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    code = SAVE_DTYPES[dtype]
    (directory / CONFIG_FILE).write_text(json.dumps(meta | {"dtype": dtype}, indent=2) + "\n")
    if max_shard_bytes is None:
        write_safetensors(directory / WEIGHTS_FILE, tensors, code)
        return
    groups: list[dict[str, np.ndarray]] = [{}]
    size = 0
    itemsize = 4 if code == "F32" else 2
    for name, array in tensors.items():
        if groups[-1] and size + array.size * itemsize > max_shard_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = array
        size += array.size * itemsize
    weight_map, total = {}, 0
    for i, group in enumerate(groups, 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        total += write_safetensors(directory / file, group, code)
        weight_map.update(dict.fromkeys(group, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
