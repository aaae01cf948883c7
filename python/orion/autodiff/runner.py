"""Loss and gradients of a whole model through the planned programs: :class:`GradientRunner`.

The step: embedding on the CPU, the layer forward programs (keeping each layer's inputs and the activations
the plan saves for its gradient), the head and cross-entropy on the CPU in fp32, then the layer gradient
programs from the last layer down (each takes the saved activations, or recomputes its layer's forward), and
the embedding's scatter. ANE programs run in fp16; the cotangent entering them is
multiplied by ``loss_scale`` and every gradient leaving them divided by it, in fp32 (the static form; the
trainer's dynamic scaler wraps this). A non-finite gradient raises :class:`NonFiniteGradient` naming the
tensor, never rewritten.

How weights reach the programs (``weights=``, one API for three strategies, docs/autodiff.md):

- ``"inputs"`` (default): every weight is a program input; each program kind is compiled once and shared by
  all layers, and a parameter update needs no compile.
- ``"patch"``: the ``baked`` weights are constants of per-layer programs (``orion.graph.bake`` of the
  planned graphs, after the backward transform), compiled once per layer; :meth:`GradientRunner.update`
  swaps their weight files through ``Program.with_weights``: no compile per step.
- ``"recompile"``: the same per-layer programs, compiled again by every :meth:`GradientRunner.update`
  (``compiles_per_update`` compiles; the trainer restarts the process before they cross the budget, ANE-11).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping

import numpy as np

from orion import _core, blobfile
from orion._core import kernels
from orion.autodiff import cpu, numpy_eval
from orion.autodiff.partition import ANE, Plan, PlannedProgram, layer_params, partition, program_outputs
from orion.autodiff.trainable import TrainableModel, input_layout
from orion.autodiff.transform import SAVED_PREFIX, grad_name
from orion.compiler import CompiledGraph, Lowered, compile_graph, lower_graph
from orion.constraints import violation
from orion.emit import WEIGHT_DIR
from orion.errors import CompileError, EvaluateError, OrionError
from orion.graph.bake import bake
from orion.limits import FP16_MAX
from orion.passes.sram import SRAMBudgetWarning
from orion.runtime.program import compile as compile_mil

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
WEIGHT_STRATEGIES = ("inputs", "patch", "recompile")


class NonFiniteGradient(EvaluateError):
    """A gradient (or activation) came back Inf or NaN: the step must be skipped, not patched."""


class GradientRunner:
    """``loss_and_grads(params, ids, targets)`` for ``model`` over sequences of ``seq`` tokens.

    ``GradientRunner(model, seq, plan=None, *, weights="inputs", baked=None, trainable=None, params=None,
    **partition_options)``:

    - ``weights``: ``"inputs"``, ``"patch"`` or ``"recompile"`` (see the module docstring).
    - ``baked``: the layer parameters (names of ``model.layer_shapes()``) baked into per-layer programs; default
      none for ``"inputs"``, all for ``"patch"``/``"recompile"``. Baking a parameter that is trained needs
      ``"patch"`` or ``"recompile"``; a frozen one (not in ``trainable``) may be baked under any strategy and
      is never re-baked (LoRA: frozen bases baked, adapters as inputs).
    - ``trainable``: the layer parameters whose gradients are returned (default all); the plan computes no
      dW for the others. Embedding and head gradients are always returned.
    - ``params``: the values to bake, required when anything is baked.

    After changing the parameters, call :meth:`update` with the new ones: it re-bakes the trained baked
    weights (the other parameters are read from each ``loss_and_grads`` call's ``params``).
    """

    def __init__(self, model: TrainableModel, seq: int, plan: Plan | None = None, *, weights: str = "inputs",
                 baked: Collection[str] | None = None, trainable: Collection[str] | None = None,
                 params: Mapping[str, np.ndarray] | None = None, **partition_options: object) -> None:
        if weights not in WEIGHT_STRATEGIES:
            raise OrionError(f"GradientRunner: weights={weights!r}. Fix: use one of {WEIGHT_STRATEGIES}")
        self.model, self.seq, self.weights = model, seq, weights
        self.trainable = layer_params(model, trainable, "trainable")
        default = () if weights == "inputs" else None
        self.baked = layer_params(model, default if baked is None else baked, "baked")
        rebaked = [n for n in self.baked if n in self.trainable]
        if weights == "inputs" and rebaked:
            raise OrionError(f"GradientRunner: {rebaked} are baked and trained, which weights='inputs' cannot update. "
                             "Fix: use weights='patch' or 'recompile', or do not bake trained parameters")
        if self.baked and params is None:
            raise OrionError(f"GradientRunner: {len(self.baked)} baked parameters but no params to bake. Fix: pass "
                             "params= (the model's parameters)")
        self.plan = plan or partition(model, seq, trainable=self.trainable, **partition_options)
        computed = {name for p in self.plan.gradients for name in program_outputs(p)}
        missing = [n for n in ["x", *self.trainable] if n not in computed]
        if missing:
            raise OrionError(f"GradientRunner: the plan computes no gradient for {missing}. Fix: plan with "
                             "partition(model, seq, trainable=...) covering them, or pass no plan")
        self._forward = self._slot(self.plan.forward, params)
        self._gradients = [self._slot(p, params) for p in self.plan.gradients]
        # Every program of a layer takes fp16 inputs (all on the ANE): each layer's inputs are rounded to fp16
        # once per step, for its forward and gradient programs both, instead of once per program call.
        self._fp16_inputs = all(p.device == ANE for p in (self.plan.forward, *self.plan.gradients))
        # The layer inputs some program takes: a baked weight (LoRA's frozen base) is in none, so it is neither
        # converted to fp16 nor kept per step.
        self._taken = {name for slot in self._slots for name in slot.inputs}
        self._head_scratch: dict[str, np.ndarray] = {}  # the head's gradients of a window added to earlier ones

    def _slot(self, program: PlannedProgram, params: Mapping[str, np.ndarray] | None) -> _Shared | _PerLayer:
        names = _baked_inputs(program, self.baked)
        return _PerLayer(self.model, program, names, params) if names else _Shared(program)

    @property
    def compiles_per_update(self) -> int:
        """Compiles one :meth:`update` does (see :func:`planned_compiles`)."""
        return planned_compiles(self.plan, self.model, self.weights, self.baked, self.trainable)[1]

    @property
    def rebakes(self) -> bool:
        """True when :meth:`update` has work: some baked weight is trained (``"patch"`` or ``"recompile"``)."""
        return bool(self._rebaked())

    @property
    def _slots(self) -> list[_Shared | _PerLayer]:
        return [self._forward, *self._gradients]

    def _rebaked(self) -> list[_PerLayer]:
        """The per-layer programs holding a trained baked weight."""
        return [s for s in self._slots if isinstance(s, _PerLayer) and set(s.names) & set(self.trainable)]

    def update(self, params: Mapping[str, np.ndarray]) -> None:
        """The parameters changed (an optimizer step): re-bake the trained baked weights from ``params``
        (``"patch"``: new weight files, no compile; ``"recompile"``: compiled again). Nothing to do otherwise."""
        for slot in self._rebaked():
            slot.rebake(params, recompile=self.weights == "recompile")

    def unload(self) -> None:
        """Releases the per-layer programs (the shared ones stay in the process's program cache)."""
        for slot in self._slots:
            if isinstance(slot, _PerLayer):
                slot.unload()

    def loss_and_grads(self, params: dict[str, np.ndarray], ids: np.ndarray, targets: np.ndarray,
                       loss_scale: float = 1.0, *, into: dict[str, np.ndarray] | None = None, add: bool = False
                       ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy of predicting ``targets`` from ``ids`` and its fp32 gradient for every trained
        parameter (baked weights hold the values of the last :meth:`update`, or of construction).

        ``into`` (a dict the caller keeps across calls; returned as the gradients): each layer gradient is written
        into its array there (made on first use) by its unscale pass, so a step page-faults no new memory for
        them, and with ``add=True`` added to what the array holds (accumulation over windows); the head's and the
        embedding's gradients are written into their arrays there (the classifier's by its product, a tied
        embedding's rows added to it), or added to them."""
        if add and into is None:
            raise OrionError("GradientRunner.loss_and_grads: add=True needs into= (the gradients to add to)")
        ids, targets = self._check_window("loss_and_grads", ids, targets)
        m = self.model
        out: dict[str, np.ndarray] = {} if into is None else into
        x, layer_inputs = self._layers_forward(params, ids)
        # The head writes its parameters' gradients into this step's arrays (add=False) or the runner's scratch
        # (added below): no table-sized array of new memory per window.
        loss, dx, cpu_grads = m.head(params, x, targets, into=self._head_scratch if add else out)
        shapes = m.layer_shapes()
        for i in reversed(range(m.n_layers)):
            cotangent = _to_fp16_range(cpu.to_channels(dx * loss_scale))
            results: dict[str, np.ndarray] = {}
            for slot in self._gradients:
                results.update(slot(i, {**layer_inputs[i], grad_name("y"): cotangent}))
            for program in self.plan.gradients:  # weight gradients placed on the CPU: dy x^T in fp32
                results.update({grad_name(t.param): t(results) for t in program.cpu_dw})
            for name in self.trainable:
                key = m.layer_param(i, name)
                out[key] = _unscaled(results[grad_name(name)], shapes[name], loss_scale, key, out.get(key), add)
            dx = _finite(cpu.from_channels(results[grad_name("x")]) / loss_scale, f"layer {i} input gradient")
        # A tied embedding's rows are added into the classifier's gradient in place.
        cpu_grads.update(m.embed_backward(params, ids, dx, into=cpu_grads))
        for name, g in cpu_grads.items():
            if add:
                out[name] += g
            else:
                out[name] = g
        if add:
            self._head_scratch = cpu_grads
        return loss, out


    def loss(self, params: dict[str, np.ndarray], ids: np.ndarray, targets: np.ndarray) -> float:
        """The mean cross-entropy of :meth:`loss_and_grads`, by the forward programs alone (validation; the head
        forms no parameter gradient)."""
        ids, targets = self._check_window("loss", ids, targets)
        return self.model.head(params, self._layers_forward(params, ids)[0], targets, frozen=True)[0]

    def _check_window(self, caller: str, ids: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids, targets = np.asarray(ids), np.asarray(targets)
        if ids.shape != (self.seq,) or targets.shape != (self.seq,):
            raise EvaluateError(f"{caller}: ids {ids.shape} and targets {targets.shape}, expected ({self.seq},) "
                                f"each. Fix: pass {self.seq} token ids and {self.seq} targets")
        return ids, targets

    def _layers_forward(self, params: dict[str, np.ndarray], ids: np.ndarray
                        ) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
        """The last layer's output ``[S, C]`` and each layer's program inputs and the activations its forward
        program saves (``saved_<node>``, fp16), kept for its gradient program."""
        m = self.model
        x = m.embed(params, ids).astype(np.float32)
        layer_inputs = []
        for i in range(m.n_layers):
            inputs = m.layer_inputs(params, i)
            arrays = {"x": cpu.to_channels(x), **{name: inputs[name] for name in inputs if name in self._taken}}
            if self._fp16_inputs:
                arrays = {name: _fp16(a) for name, a in arrays.items()}
            layer_inputs.append(arrays)
            results = self._forward(i, arrays)
            arrays.update((name, value) for name, value in results.items() if name.startswith(SAVED_PREFIX))
            x = _finite(cpu.from_channels(results["y"]), f"layer {i} output")
        return x, layer_inputs


def planned_compiles(plan: Plan, model: TrainableModel, weights: str = "inputs", baked: Collection[str] | None = None,
                     trainable: Collection[str] | None = None) -> tuple[int, int]:
    """``(to build, per update)``: the compiles a runner of ``plan`` does at construction (one per shared ANE
    program, one per layer for each ANE program with a baked weight; at most: shared programs already in the
    process's program cache cost none) and in each :meth:`GradientRunner.update` (``"recompile"``: one per
    layer for each program holding a trained baked weight; 0 otherwise). Arguments as for the runner."""
    baked = layer_params(model, (() if weights == "inputs" else None) if baked is None else baked, "baked")
    trained = set(layer_params(model, trainable, "trainable"))
    ane = [(p, _baked_inputs(p, baked)) for p in plan.programs if p.device == ANE]
    build = sum(model.n_layers if names else 1 for _, names in ane)
    update = sum(model.n_layers for _, names in ane if set(names) & trained) if weights == "recompile" else 0
    return build, update


def _baked_inputs(program: PlannedProgram, baked: Collection[str]) -> list[str]:
    """The ``baked`` names that are inputs of an ANE ``program`` (a CPU program takes every weight as input)."""
    if program.device != ANE:
        return []
    inputs = {n.name for n in program.graph.inputs}
    return [n for n in baked if n in inputs]


class _Shared:
    """One program serving every layer: compiled once (ANE) or evaluated in fp32 numpy (CPU)."""

    def __init__(self, program: PlannedProgram) -> None:
        self.inputs = [n.name for n in program.graph.inputs]
        if program.device == ANE:
            compiled = compile_graph(program.graph, max_layers=program.fused)
            self._run: Run = lambda arrays: compiled(**arrays)
        else:
            self._run = lambda arrays: numpy_eval.evaluate(program.graph, arrays)

    def __call__(self, layer: int, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run({name: arrays[name] for name in self.inputs})


class _PerLayer:
    """An ANE program with ``names`` baked: one compiled program per layer, holding that layer's values.

    The MIL text does not depend on the baked values, only the weight files do. When every weight file that
    holds a baked value holds it as is or transposed (flat fp16; the transpose is a linear's input gradient
    ``W^T dy``, :func:`orion.graph.bake.bake`; proven once, by lowering with other values and comparing), new
    weights are written straight into those files; otherwise the baked graph is lowered again."""

    def __init__(self, model: TrainableModel, program: PlannedProgram, names: list[str],
                 params: Mapping[str, np.ndarray]) -> None:
        self.model, self.program, self.names, self.layers = model, program, names, model.n_layers
        self.inputs = [n.name for n in program.graph.inputs if n.name not in names]
        first = self._values(params, 0)
        self.lowered = self._lower(first)
        self.files = self._files(first)
        self.compiled = [self._compile(self._weights(params, i)) for i in range(self.layers)]

    def _values(self, params: Mapping[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
        values = {n: input_layout(np.asarray(params[self.model.layer_param(layer, n)])) for n in self.names}
        for name, v in values.items():
            if not np.all(np.isfinite(v)) or np.abs(v).max(initial=0.0) > FP16_MAX:
                raise violation("ANE-25", self.model.layer_param(layer, name), "a baked weight is not finite or "
                                f"beyond +-{FP16_MAX:.0f}", "clamp the weights into fp16 range before baking them")
        return values

    def _lower(self, values: dict[str, np.ndarray]) -> Lowered:
        with warnings.catch_warnings():  # the plan reports the working set; baked weights add to it (ANE-26)
            warnings.simplefilter("ignore", SRAMBudgetWarning)
            return lower_graph(bake(self.program.graph, values), max_layers=self.program.fused)

    def _files(self, values: dict[str, np.ndarray]) -> dict[str, tuple[str, bool]] | None:
        """Weight-file path -> (the baked name it holds, whether transposed), or None when some file cannot be
        written directly. A file named after a baked input holds it as is; another may hold one transposed."""
        files = {}
        transposed: dict[str, bytes] = {}
        for path, data in self.lowered.weights.items():
            stem = path[len(WEIGHT_DIR):-len(".bin")]
            named = [n for n in self.names if stem == n or (stem.startswith(f"{n}_") and stem[len(n) + 1:].isdigit())]
            holders = [(n, False) for n in named if data == _blob(values[n])]
            if not named:
                holders = [(n, True) for n in self.names
                           if data == transposed.setdefault(n, _blob(_transposed(values[n])))]
            if len(holders) == 1:
                files[path] = holders[0]
        rng = np.random.default_rng(0)
        probe = {n: rng.uniform(-1.0, 1.0, v.shape) for n, v in values.items()}
        other = self._lower(probe)
        written = {**self.lowered.weights, **{p: _blob(_transposed(probe[n]) if t else probe[n])
                                              for p, (n, t) in files.items()}}
        return files if other.mil == self.lowered.mil and other.weights == written else None

    def _weights(self, params: Mapping[str, np.ndarray], layer: int) -> dict[str, bytes]:
        values = self._values(params, layer)
        if self.files is not None:  # each value converted to fp16 once, whatever number of files hold it
            blobs = {(n, t): _blob(_transposed(values[n]) if t else values[n]) for n, t in set(self.files.values())}
            return {**self.lowered.weights, **{p: blobs[held] for p, held in self.files.items()}}
        lowered = self._lower(values)
        if lowered.mil != self.lowered.mil:
            raise CompileError(f"{self.program.name}: baking layer {layer}'s weights changed the MIL text, not only "
                               "the weight files. Fix: report this; bake must not depend on the values")
        return lowered.weights

    def _compile(self, weights: dict[str, bytes]) -> CompiledGraph:
        lowered = Lowered(self.lowered.mil, weights, self.lowered.layout, self.lowered.report)
        return CompiledGraph(lowered, compile_mil(lowered.mil, weights))  # its own program: it is unloaded later

    def rebake(self, params: Mapping[str, np.ndarray], *, recompile: bool) -> None:
        """New baked values for every layer: compiled again, or patched into the loaded program."""
        for i, old in enumerate(self.compiled):
            weights = self._weights(params, i)
            if recompile:
                self.compiled[i] = self._compile(weights)
            else:
                lowered = Lowered(self.lowered.mil, weights, self.lowered.layout, self.lowered.report)
                self.compiled[i] = CompiledGraph(lowered, old.program.with_weights(weights))
            old.program.unload()

    def unload(self) -> None:
        for compiled in self.compiled:
            compiled.program.unload()

    def __call__(self, layer: int, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.compiled[layer](**{name: arrays[name] for name in self.inputs})


def _blob(value: np.ndarray) -> bytes:
    """The weight file of a baked value, as the emitter writes it."""
    return blobfile.write(np.asarray(value).astype(np.float16))


def _transposed(value: np.ndarray) -> np.ndarray:
    """A baked ``[1, Cout, 1, Cin]`` weight as the ``[Cin, Cout]`` const of its input gradient's linear."""
    return np.ascontiguousarray(np.asarray(value)[0, :, 0, :].T)


def _fp16(a: np.ndarray) -> np.ndarray:
    """A float32 array rounded to fp16 as an fp16 program input surface rounds it (ties to even, overflow to
    Inf), on every core; other arrays as they are."""
    if a.dtype != np.float32:
        return a
    out = np.empty(a.shape, np.float16)
    kernels.to_fp16(np.ascontiguousarray(a), out)
    return out


def _unscaled(result: np.ndarray, shape: tuple[int, ...], loss_scale: float, what: str,
              out: np.ndarray | None = None, add: bool = False) -> np.ndarray:
    """A program's (fp16) gradient ``result`` as fp32 of ``shape`` divided by ``loss_scale`` (numpy's
    ``np.divide(result, loss_scale, dtype=np.float32)`` bits), widened, unscaled and checked in one parallel pass,
    into ``out`` (reused when it is a float32 array of ``shape``; ``add=True``: added to it, as ``out += ...``);
    :class:`NonFiniteGradient` if any value of this result is Inf or NaN."""
    if add and (out is None or out.shape != shape):
        raise OrionError(f"{what}: no gradient of shape {shape} to add to. Fix: pass the previous window's gradients")
    if out is None or out.shape != shape or out.dtype != np.float32:
        out = np.empty(shape, np.float32)
    nonfinite = _core.train.unscale(what, np.ascontiguousarray(result), out, loss_scale, add)
    if nonfinite:
        raise NonFiniteGradient(f"{what}: {nonfinite} non-finite values. Fix: lower the loss scale (or skip this "
                                "step); Orion never rewrites them")
    return out


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
