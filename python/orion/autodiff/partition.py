"""The partitioner: what of a training step runs as ANE programs and what on the CPU in fp32.

Per layer (one graph shared by all layers, weights as inputs) it plans a forward program and the gradient
program(s): the whole layer gradient (dx and every dW) as one program when it lowers under the hardware
rules and fits the SRAM budget, else one dx program plus dW programs over parameter groups that fit.
When the forward and the whole gradient are both ANE programs, the forward also returns the activations the
gradient rules read (``saved_<node>``) and the gradient takes them instead of recomputing its layer's
forward (a quarter of its FLOPs for a Llama layer); if that pair is not legal or does not fit, the gradient
recomputes them.
A program goes to the ANE when it is legal and pays for itself: its modeled ANE time (FLOPs at
``CostModel.ane_flops`` plus one dispatch, ANE-28) beats its modeled CPU time (``CostModel.cpu_flops``).
The embedding (a gather), the final norm, the classifier and cross-entropy always run on the CPU in fp32.

Weight gradients of linears (``dW = dy x^T``) go where ``dw`` says: ``"ane"``, inside the gradient program in
fp16 (fp32 accumulation), or ``"cpu"``, the public trainers' choice: the gradient program returns each such
linear's input ``x`` and output cotangent ``dy`` (fp16) and the CPU forms ``dy x^T`` in fp32. The default,
:data:`DEFAULT_DW`, follows the measurement in docs/autodiff.md (``benchmarks/dw_placement.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np

from orion.autodiff.flops import graph_flops
from orion.autodiff.trainable import TrainableModel
from orion.autodiff.transform import backward, grad_name, saved_activations
from orion.compiler import lower_graph
from orion.errors import OrionError
from orion.graph.bake import bake
from orion.graph.builder import Graph
from orion.graph.ir import GraphError, Node, dtype_size
from orion.legalize import IOLayout
from orion.limits import DISPATCH_MS, MIN_SURFACE_BYTES, SRAM_BYTES
from orion.passes.sram import NAME as SRAM_PASS
from orion.passes.sram import SRAMBudgetWarning

ANE, CPU = "ane", "cpu"
DW_PLACEMENTS = (ANE, CPU)
DEFAULT_DW = ANE  # set by the measurement in docs/autodiff.md


@dataclass(frozen=True)
class CostModel:
    """Throughputs the "does it pay" test assumes: sustained fp16 FLOP/s of the ANE on matmul-heavy programs
    and fp32 FLOP/s of the CPU (2 cores, AVX2), plus the ANE's per-evaluate dispatch cost."""

    ane_flops: float = 5e12
    cpu_flops: float = 100e9
    dispatch_ms: float = DISPATCH_MS

    def ane_ms(self, flops: float) -> float:
        return flops / self.ane_flops * 1e3 + self.dispatch_ms

    def cpu_ms(self, flops: float) -> float:
        return flops / self.cpu_flops * 1e3


@dataclass(frozen=True)
class PlannedProgram:
    """One planned program of a layer: its graph, where it runs and why; ``count`` evaluations per step."""

    name: str
    graph: Graph
    device: str
    flops: float
    count: int
    reason: str
    sram_bytes: int = 0
    fused: int = 1  # attention ops of the one layer the program holds (its ANE-09 max_layers)
    surface_bytes: int = 0  # its I/O surfaces: every input, and every output, as large as the largest (ANE-13)
    cpu_dw: tuple[CpuWeightGradient, ...] = ()  # weight gradients the CPU forms from this program's outputs


@dataclass(frozen=True)
class CpuWeightGradient:
    """A linear's weight gradient left to the CPU: ``dW = dy x^T`` in fp32 from two outputs of a gradient
    program, ``dy`` (the linear's output cotangent, ``[1, Cout, 1, S]``) and ``x`` (its input, ``[1, Cin, 1, S]``)."""

    param: str
    dy: str
    x: str

    def __call__(self, results: dict[str, np.ndarray]) -> np.ndarray:
        """``dW`` as ``[1, Cout, 1, Cin]`` fp32, from the program's results."""
        dy, x = (np.asarray(results[name], np.float32) for name in (self.dy, self.x))
        dy, x = dy.reshape(dy.shape[1], dy.shape[3]), x.reshape(x.shape[1], x.shape[3])
        return (dy @ x.T).reshape(1, dy.shape[0], 1, x.shape[0])


@dataclass(frozen=True)
class CpuStage:
    """Work that stays on the CPU in fp32, with its FLOPs per step."""

    name: str
    flops: float
    reason: str


@dataclass(frozen=True)
class Plan:
    """The partition of one training step (one sequence of ``seq`` tokens)."""

    model: str
    seq: int
    forward: PlannedProgram
    gradients: tuple[PlannedProgram, ...]
    cpu: tuple[CpuStage, ...]

    @property
    def programs(self) -> tuple[PlannedProgram, ...]:
        return (self.forward, *self.gradients)

    @property
    def ane_flops(self) -> float:
        return sum(p.flops * p.count for p in self.programs if p.device == ANE)

    @property
    def cpu_flops(self) -> float:
        return sum(p.flops * p.count for p in self.programs if p.device == CPU) + sum(s.flops for s in self.cpu)

    @property
    def dispatches(self) -> int:
        """ANE evaluations per step."""
        return sum(p.count for p in self.programs if p.device == ANE)

    def __str__(self) -> str:
        total = self.ane_flops + self.cpu_flops
        lines = [f"{self.model}, {self.seq} tokens per step: ANE {self.ane_flops / 1e9:.3f} GFLOP "
                 f"({100 * self.ane_flops / total:.1f}%), CPU {self.cpu_flops / 1e9:.3f} GFLOP, "
                 f"{self.dispatches} ANE dispatches per step"]
        for p in self.programs:
            lines.append(f"  {p.device.upper()} {p.name} x{p.count}: {p.flops * p.count / 1e9:.3f} GFLOP, "
                         f"{p.sram_bytes / 2**20:.1f} MB working set, {p.surface_bytes / 2**20:.1f} MB of I/O "
                         f"surfaces per layer; {p.reason}")
        for s in self.cpu:
            lines.append(f"  CPU {s.name}: {s.flops / 1e9:.3f} GFLOP; {s.reason}")
        return "\n".join(lines)


def partition(model: TrainableModel, seq: int, *, sram_budget: int = SRAM_BYTES, cost: CostModel | None = None,
              prefer: str = "auto", trainable: Collection[str] | None = None, dw: str = DEFAULT_DW) -> Plan:
    """Plan a training step of ``model`` over ``seq`` tokens. ``prefer="ane"`` puts every legal program that
    fits on the ANE whatever the cost model says (tests use it to run tiny models through the programs);
    ``"cpu"`` runs every layer program on the CPU. ``trainable`` names the layer parameters that get a
    gradient (default all of ``model.layer_shapes()``); the others are frozen: no dW is computed for them.
    ``dw``: where the linears' weight gradients are formed, ``"ane"`` or ``"cpu"`` (fp32; see the module
    docstring). With ``"cpu"`` a layer gradient that is not an ANE program falls back as with ``"ane"``."""
    if prefer not in ("auto", "ane", "cpu"):
        raise OrionError(f"partition: prefer={prefer!r}. Fix: use 'auto', 'ane' or 'cpu'")
    if dw not in DW_PLACEMENTS:
        raise OrionError(f"partition: dw={dw!r}. Fix: use one of {DW_PLACEMENTS}")
    cost = cost or CostModel()
    layer = model.layer_graph(seq)
    n = model.n_layers
    fused = model.attention_per_layer
    forward = _place("layer forward", layer, n, sram_budget, cost, prefer, fused)
    params = layer_params(model, trainable, "trainable")
    what = "every dW" if len(params) == len(model.layer_shapes()) else f"the dW of {len(params)} trained parameters"
    whole = _place(f"layer gradient (dx and {what})", backward(layer, ["x", *params]), n, sram_budget, cost, prefer,
                   fused)
    if dw == CPU:
        taps = cpu_weight_gradients(layer, params)
        rest = [p for p in params if p not in {t.param for t in taps}]
        graph = backward(layer, ["x", *rest], values={t.x: _linear_of(layer, t.param).inputs[0].name for t in taps},
                         cotangents={t.dy: _linear_of(layer, t.param).name for t in taps})
        tapped = replace(_place(f"layer gradient (dx, {len(rest)} dW; {len(taps)} dW on the CPU in fp32)", graph, n,
                                sram_budget, cost, prefer, fused), cpu_dw=tuple(taps))
        whole = tapped if tapped.device == ANE or whole.device != ANE else whole
    if dw == ANE and whole.device == ANE and forward.device == ANE:
        forward, whole = _saving_activations(layer, ["x", *params], forward, whole, sram_budget, cost, prefer)
    if whole.device == ANE or whole.reason.startswith("CPU pays") or prefer == "cpu":
        gradients: tuple[PlannedProgram, ...] = (whole,)
    else:  # over budget or illegal as one program: dx alone, then dW over groups of parameters that fit
        gradients = (_place("layer gradient dx", backward(layer, ["x"]), n, sram_budget, cost, prefer, fused),
                     *_weight_groups(layer, params, n, sram_budget, cost, prefer, fused))
    c, vocab = model.dim, model.vocab_size
    cpu = (CpuStage("embedding gather and scatter", 0.0, "a table lookup, no ANE op; its gradient a scatter-add"),
           CpuStage("final norm, classifier and cross-entropy (forward and backward)", 6.0 * seq * c * vocab,
                    "fp32 over the vocabulary: logits, dlogits, dx and dW of the classifier"))
    return Plan(model.name, seq, forward, gradients, cpu)


def _saving_activations(layer: Graph, wrt: list[str], forward: PlannedProgram, whole: PlannedProgram, budget: int,
                        cost: CostModel, prefer: str) -> tuple[PlannedProgram, PlannedProgram]:
    """The forward and whole-gradient programs with the forward returning the values the gradient reads
    (``backward(save_activations=True)``) instead of the gradient recomputing them, when both stay on the ANE;
    else ``forward`` and ``whole`` as they are."""
    gradient = backward(layer, wrt, save_activations=True)
    saved = saved_activations(gradient)
    if not saved:
        return forward, whole
    returning = bake(layer, {})  # a copy, given the saved values as outputs
    nodes = {n.name: n for n in returning.nodes}
    for output, node in saved.items():
        returning.output(nodes[node], output)
    fused = forward.fused
    placed = (_place(f"{forward.name} (returning {len(saved)} activations)", returning, forward.count, budget, cost,
                     prefer, fused),
              _place(f"{whole.name} from the saved activations", gradient, whole.count, budget, cost, prefer, fused))
    return placed if all(p.device == ANE for p in placed) else (forward, whole)


def layer_params(model: TrainableModel, names: Collection[str] | None, what: str) -> list[str]:
    """``names`` (all of ``model``'s layer parameters when None) in the model's order; unknown ones raise."""
    shapes = model.layer_shapes()
    if names is None:
        return list(shapes)
    if isinstance(names, str):
        raise OrionError(f"{what}={names!r} is a string. Fix: pass a collection of layer parameter names")
    unknown = sorted(set(names) - set(shapes))
    if unknown:
        raise OrionError(f"{what}: {unknown} are not layer parameters of {model.name} (they are {list(shapes)}). "
                         "Fix: name parameters inside a layer, without the layer prefix")
    return [name for name in shapes if name in set(names)]


def _place(name: str, graph: Graph, count: int, budget: int, cost: CostModel, prefer: str, fused: int) -> PlannedProgram:
    """Lower ``graph`` (``fused`` attention ops make one layer) to check it is legal and measure its working
    set, then choose its device."""
    flops = graph_flops(graph)
    if prefer == "cpu":
        return PlannedProgram(name, graph, CPU, flops, count, "CPU requested", fused=fused)
    try:
        with warnings.catch_warnings():  # over budget is a planning outcome here, reported in the plan
            warnings.simplefilter("ignore", SRAMBudgetWarning)
            lowered = lower_graph(graph, sram_budget=budget, max_layers=fused)
    except (OrionError, GraphError) as illegal:
        return PlannedProgram(name, graph, CPU, flops, count, f"not ANE-legal: {illegal}", fused=fused)
    sram = lowered.report.analyses[SRAM_PASS]
    sized = {"sram_bytes": sram.total, "fused": fused, "surface_bytes": _surface_bytes(lowered.layout)}
    if sram.over_budget:
        return PlannedProgram(name, graph, CPU, flops, count, f"over the SRAM budget (ANE-26): {sram}", **sized)
    ane_ms, cpu_ms = cost.ane_ms(flops), cost.cpu_ms(flops)
    if prefer == "auto" and ane_ms >= cpu_ms:
        return PlannedProgram(name, graph, CPU, flops, count,
                       f"CPU pays: {cpu_ms:.3f} ms fp32 vs {ane_ms:.3f} ms on the ANE with dispatch", **sized)
    return PlannedProgram(name, graph, ANE, flops, count, f"ANE {ane_ms:.3f} ms vs CPU {cpu_ms:.3f} ms", **sized)


def _surface_bytes(layout: IOLayout) -> int:
    """Bytes of one binding of a program's surfaces: all inputs as large as the largest input, all outputs as
    large as the largest output, none below the minimum (ANE-12, ANE-13)."""
    total = 0
    for specs in (layout.inputs, layout.outputs):
        surfaces = IOLayout.surfaces(specs)  # tensors packed into one surface (ANE-37) count once
        largest = max([MIN_SURFACE_BYTES] + [int(np.prod(shape)) * dtype_size(dtype) for shape, dtype in surfaces.values()])
        total += largest * len(surfaces)
    return total


def _weight_groups(layer: Graph, params: Sequence[str], count: int, budget: int, cost: CostModel,
                   prefer: str, fused: int) -> list[PlannedProgram]:
    """dW programs over consecutive parameter groups, each as large as still fits (a single parameter that
    does not fit is planned alone, on the device :func:`_place` gives it)."""
    programs, start = [], 0
    while start < len(params):
        best = None
        for stop in range(start + 1, len(params) + 1):
            group = list(params[start:stop])
            placed = _place(f"layer gradient dW[{', '.join(group)}]", backward(layer, group), count, budget, cost,
                            prefer, fused)
            if placed.device != ANE and best is not None:
                break
            best, end = placed, stop
        programs.append(best)
        start = end
    return programs


def program_outputs(program: PlannedProgram) -> list[str]:
    """The parameter (or ``x``) names whose gradients ``program`` returns (or the CPU forms from its outputs)."""
    prefix = grad_name("")
    return [name[len(prefix):] for name in program.graph.outputs if name.startswith(prefix)] + \
        [t.param for t in program.cpu_dw]


def _linear_of(layer: Graph, param: str) -> Node | None:
    """The one linear whose runtime weight is input ``param`` (None when it is read otherwise or elsewhere)."""
    users = [n for n in layer.nodes if any(i.op == "input" and i.name == param for i in n.inputs)]
    if len(users) == 1 and users[0].op == "linear" and users[0].inputs[1] is not users[0].inputs[0] \
            and users[0].inputs[1].name == param:
        return users[0]
    return None


def cpu_weight_gradients(layer: Graph, params: Sequence[str]) -> list[CpuWeightGradient]:
    """The ``params`` whose gradient the CPU can form as ``dy x^T``: each the weight of exactly one linear and
    read nowhere else. Linears reading one input share its output (``dw_x_<first param>``)."""
    taps, x_output = [], {}
    for param in params:
        linear = _linear_of(layer, param)
        if linear is None:
            continue
        source = linear.inputs[0]
        x_output.setdefault(id(source), f"dw_x_{param}")
        taps.append(CpuWeightGradient(param, f"dw_dy_{param}", x_output[id(source)]))
    return taps
