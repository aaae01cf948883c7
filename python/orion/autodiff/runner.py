"""Loss and gradients of a whole model through the planned programs: :class:`GradientRunner`.

Every program is compiled once, at construction, and shared by all layers; each call only passes new
arrays (weights are inputs, so parameter updates take effect without a compile). The step: embedding on the
CPU, the layer forward programs (keeping each layer's input), the head and cross-entropy on the CPU in fp32,
then the layer gradient programs from the last layer down (each recomputes its layer's forward), and the
embedding's scatter. ANE programs run in fp16; the cotangent entering them is multiplied by ``loss_scale``
and every gradient leaving them divided by it, in fp32 (the static form; the trainer's dynamic scaler wraps
this). A non-finite gradient raises :class:`NonFiniteGradient` naming the tensor, never rewritten.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from orion.autodiff import cpu, numpy_eval
from orion.autodiff.partition import ANE, Plan, Program, partition, program_outputs
from orion.autodiff.trainable import TrainableModel
from orion.autodiff.transform import grad_name
from orion.compiler import compile_graph
from orion.errors import EvaluateError
from orion.limits import FP16_MAX

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class NonFiniteGradient(EvaluateError):
    """A gradient (or activation) came back Inf or NaN: the step must be skipped, not patched."""


class GradientRunner:
    """``loss_and_grads(params, ids, targets)`` for ``model`` over sequences of ``seq`` tokens."""

    def __init__(self, model: TrainableModel, seq: int, plan: Plan | None = None, **partition_options: object) -> None:
        self.model, self.seq = model, seq
        self.plan = plan or partition(model, seq, **partition_options)
        self._forward = self._runner(self.plan.forward)
        self._gradients = [(self._runner(p), program_outputs(p)) for p in self.plan.gradients]

    @staticmethod
    def _runner(program: Program) -> Run:
        if program.device == ANE:
            compiled = compile_graph(program.graph, max_layers=program.fused)
            return lambda arrays: compiled(**arrays)
        return lambda arrays: numpy_eval.evaluate(program.graph, arrays)

    def loss_and_grads(self, params: dict[str, np.ndarray], ids: np.ndarray, targets: np.ndarray,
                       loss_scale: float = 1.0) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy of predicting ``targets`` from ``ids`` and its fp32 gradient for every parameter."""
        ids, targets = np.asarray(ids), np.asarray(targets)
        if ids.shape != (self.seq,) or targets.shape != (self.seq,):
            raise EvaluateError(f"loss_and_grads: ids {ids.shape} and targets {targets.shape}, expected ({self.seq},) "
                                f"each. Fix: pass {self.seq} token ids and {self.seq} targets")
        m = self.model
        x = m.embed(params, ids).astype(np.float32)
        layer_inputs, inputs = [], []
        for i in range(m.n_layers):
            arrays = {"x": cpu.to_channels(x), **m.layer_inputs(params, i)}
            layer_inputs.append(arrays)
            x = _finite(cpu.from_channels(self._forward(arrays)["y"]), f"layer {i} output")
            inputs.append(x)
        loss, dx, grads = m.head(params, x, targets)
        for i in reversed(range(m.n_layers)):
            cotangent = _to_fp16_range(cpu.to_channels(dx * loss_scale))
            results: dict[str, np.ndarray] = {}
            for run, _ in self._gradients:
                results.update(run({**layer_inputs[i], grad_name("y"): cotangent}))
            for name, shape in m.layer_shapes().items():
                g = results[grad_name(name)].reshape(shape).astype(np.float32) / loss_scale
                grads[m.layer_param(i, name)] = _finite(g, m.layer_param(i, name))
            dx = _finite(cpu.from_channels(results[grad_name("x")]) / loss_scale, f"layer {i} input gradient")
        for name, g in m.embed_backward(params, ids, dx).items():
            grads[name] = grads[name] + g if name in grads else g
        return loss, grads


def _finite(a: np.ndarray, what: str) -> np.ndarray:
    if not np.all(np.isfinite(a)):
        raise NonFiniteGradient(f"{what}: {int((~np.isfinite(a)).sum())} non-finite values. Fix: lower the loss "
                                "scale (or skip this step); Orion never rewrites them")
    return a


def _to_fp16_range(a: np.ndarray) -> np.ndarray:
    """``a`` for an fp16 program input; values beyond fp16 raise instead of becoming Inf silently."""
    if np.abs(a).max(initial=0.0) > FP16_MAX:
        raise NonFiniteGradient(f"a cotangent reaches {np.abs(a).max():.3g}, beyond fp16 (+-{FP16_MAX:.0f}). "
                                "Fix: lower the loss scale")
    return a
