"""What a model gives the gradient machinery: :class:`TrainableModel`.

Parameters are one flat dict of fp32 arrays in their natural shapes (matrices ``[out, in]``, vectors
``[C]``); a layer's parameters are named ``<prefix><i>.<name>``, and ``<name>`` is also the input of the
one layer graph every layer shares, where a matrix is a runtime ``[1, out, 1, in]`` and a vector a
``[1, C, 1, 1]`` (weights as inputs: one compiled program serves all layers, updates need no compile).
The layer graph maps input ``x`` to output ``y`` (``[1, C, 1, S]``). The embedding and the head (final
norm, classifier, cross-entropy) are fp32 numpy on the CPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from orion.graph.builder import Graph


def input_layout(array: np.ndarray) -> np.ndarray:
    """A parameter as a layer-graph input: ``[out, in]`` -> ``[1, out, 1, in]``, ``[C]`` -> ``[1, C, 1, 1]``."""
    return array.reshape(1, array.shape[0], 1, array.shape[1] if array.ndim == 2 else 1)


def input_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The layer-graph input shape of a parameter of ``shape``."""
    return (1, shape[0], 1, shape[1] if len(shape) == 2 else 1)


class TrainableModel(ABC):
    """A transformer as the gradient machinery sees it (see the module docstring)."""

    name: str
    n_layers: int
    dim: int
    vocab_size: int
    context: int  # the longest sequence the model's positions cover
    layer_prefix: str
    attention_per_layer: int = 1  # attention ops in one layer graph (ANE-09 counts them as fused layers)
    lora_aliases: dict[str, str] = {}  # short LoRA target names (``--lora targets=q,v``) -> PEFT module names

    @abstractmethod
    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Natural shape of each per-layer parameter, by its name inside the layer."""

    @abstractmethod
    def layer_params(self, weights: Any, layer: int) -> dict[str, np.ndarray]:
        """Layer ``layer``'s parameters of the family's loaded ``weights``, by name inside the layer, in their
        natural shapes and stored dtype (:meth:`params` has them as fp32 copies)."""

    @abstractmethod
    def layer_graph(self, seq: int) -> Graph:
        """The layer over ``seq`` tokens with every parameter a runtime input (see :func:`input_shape`)."""

    @abstractmethod
    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        """Hidden states ``[S, C]`` of token ids at positions ``0..S-1``."""

    @abstractmethod
    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray,
                       into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Gradients of the embedding parameters given dL/dx ``[S, C]``; a gradient whose name is in ``into``
        (float32, its shape) is added to that array in place and returned (a tied embedding: the classifier's
        gradient gains the rows of ``ids``, no table-sized temporary)."""

    @abstractmethod
    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray, frozen: bool = False,
             into: dict[str, np.ndarray] | None = None) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        """Final norm, classifier and mean cross-entropy: ``(loss, dL/dx, gradients of head parameters)``; with
        ``frozen`` the head's parameters get no gradients (an empty dict; their products are not computed).
        ``into``: the classifier's gradient is written into the array of its name there when it fits (float32,
        its shape, C-contiguous: overwritten, the same bits) instead of new memory."""

    def layer_param(self, layer: int, name: str) -> str:
        """The flat parameter name of ``name`` in layer ``layer``."""
        return f"{self.layer_prefix}{layer}.{name}"

    def layer_inputs(self, params: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
        """Layer ``layer``'s parameters in the layer graph's input layout."""
        return {name: input_layout(params[self.layer_param(layer, name)]) for name in self.layer_shapes()}
