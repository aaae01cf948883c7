"""The numbered catalog of known ANE constraints and how Orion handles each one.

Ids ANE-01 .. ANE-34 are the stable ids of ``csrc/constraints.h``; later ids are constraints found in
FACTS.md that the header does not list yet. ``python -m orion constraints`` prints :func:`format_table`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from orion.errors import ConstraintError

# Handling kinds.
REJECTED = "rejected before compile"
LEGALIZED = "legalized"
RUNTIME = "enforced by the runtime"
REPORTED = "reported"


@dataclass(frozen=True)
class Constraint:
    """One catalog entry: what breaks on hardware, who saw it, and what Orion does about it."""

    id: str
    title: str
    symptom: str  # "compile fail" | "eval fail" | "crash" | "silent wrong data" | "slow"
    sources: str  # "[O]", "[M]", "[E]" tags of FACTS.md
    handling: str  # one of REJECTED / LEGALIZED / RUNTIME / REPORTED (or two joined by " + ")
    where: str  # module/function that does it
    test: str  # the test that shows the handling


CATALOG: tuple[Constraint, ...] = (
    Constraint("ANE-01", "concat is rejected: return several outputs or rewrite", "compile fail", "[O] ([M][E] saw it work)",
               LEGALIZED, "orion.lowering.legalize (concat -> placement conv/matmul + add)",
               "tests/compiler/test_legalize.py::test_concat"),
    Constraint("ANE-02", "gelu is rejected: use the tanh approximation", "compile fail", "[O][E]",
               LEGALIZED, "orion.lowering.legalize (gelu -> tanh/mul/add)", "tests/compiler/test_legalize.py::test_gelu"),
    Constraint("ANE-03", "rsqrt and sqrt are rejected: use pow(x, -0.5) / pow(x, 0.5)", "compile fail", "[E]",
               LEGALIZED, "orion.lowering.legalize (rsqrt/sqrt -> pow)", "tests/compiler/test_legalize.py::test_rsqrt_sqrt"),
    Constraint("ANE-04", "conv with bias= is rejected: add the bias separately", "compile fail", "[O]",
               LEGALIZED, "orion.lowering.legalize (linear -> conv + add)", "tests/compiler/test_legalize.py::test_linear_bias"),
    Constraint("ANE-05", "op arguments must reference named consts, never inline literals", "compile fail", "[O]",
               LEGALIZED, "orion.lowering.mil.to_program (every argument is a named const)",
               "tests/compiler/test_lowering.py::test_no_inline_literals"),
    Constraint("ANE-06", "returned names must be live values computed by the function", "compile fail", "[O]",
               LEGALIZED, "orion.passes.dce keeps outputs live; orion.lowering.mil names each output var",
               "tests/compiler/test_lowering.py::test_outputs_are_live_ops"),
    Constraint("ANE-07", "reduce_mean is rejected: use reduce_sum times 1/N", "compile fail", "[E] ([O] saw it work)",
               LEGALIZED, "orion.lowering.legalize (reduce_mean -> reduce_sum * 1/N)",
               "tests/compiler/test_legalize.py::test_reduce_mean"),
    Constraint("ANE-08", "softmax extent along its axis must be a power of two", "compile fail", "[E]",
               REJECTED, "orion.graph.infer (softmax, attention)", "tests/compiler/test_catalog.py::test_ane08_softmax_extent"),
    Constraint("ANE-09", "too many layers fused into one program fail to compile", "compile fail", "[E]",
               REJECTED, "orion.lowering.check.check_fusion_depth (attention count > max_layers)",
               "tests/compiler/test_catalog.py::test_ane09_fusion_depth"),
    Constraint("ANE-10", "conv with 32,000 or more input channels is rejected", "compile fail", "[M]",
               REJECTED, "orion.graph.infer (linear)", "tests/compiler/test_catalog.py::test_ane10_conv_channels"),
    Constraint("ANE-11", "about 119 compiles per process, then compiles fail or the process is unstable",
               "compile fail", "[M][O]", RUNTIME + " + " + REPORTED,
               "runtime compile budget (orion.CompileBudgetExhausted); orion.compiler caches programs by content hash",
               "tests/compiler/test_compiler.py::test_compile_cache_by_hash"),
    Constraint("ANE-12", "every I/O surface must be at least 49,152 bytes", "eval fail", "[O][E] ([M] saw 8 KB on M5)",
               LEGALIZED, "orion.passes.io_padding", "tests/compiler/test_passes.py::test_io_padding_min_size_and_lanes"),
    Constraint("ANE-13", "all inputs one surface size, all outputs one surface size", "eval fail", "[O]",
               LEGALIZED, "orion.passes.io_padding", "tests/compiler/test_passes.py::test_io_padding_uniform"),
    Constraint("ANE-14", "fp16 I/O needs >= 32 lanes (fp32 I/O 16) in the last dimension", "eval fail", "[E]",
               LEGALIZED, "orion.passes.io_padding", "tests/compiler/test_passes.py::test_io_padding_lanes"),
    Constraint("ANE-15", "one surface must not be bound as two inputs/outputs", "eval fail", "[E]",
               RUNTIME, "runtime evaluate (orion.Program.__call__ allocates one surface per I/O); "
               "orion.compiler.CompiledGraph copies every array", "runtime tests (emulator worktree)"),
    Constraint("ANE-16", "a request is immutable: build a new one to rebind surfaces", "eval fail", "[E]",
               RUNTIME, "runtime evaluate (new request per call)", "runtime tests (emulator worktree)"),
    Constraint("ANE-17", "MIL text must be passed as NSData (UTF-8), not NSString", "crash", "[O]",
               RUNTIME, "runtime compile (csrc, Apple backend); orion.compiler hands UTF-8 text",
               "runtime tests (Apple backend)"),
    Constraint("ANE-18", "the weight dictionary must be @{} when empty, never nil", "crash", "[O][M]",
               RUNTIME, "runtime compile; orion.lowering.mil returns {} (never None) without weights",
               "tests/compiler/test_lowering.py::test_weights_dict_empty_not_none"),
    Constraint("ANE-19", "the model temp dir with model.mil and weights must exist before compile", "crash", "[O]",
               RUNTIME, "runtime compile (Apple backend)", "runtime tests (Apple backend)"),
    Constraint("ANE-20", "inputs and outputs bind in alphabetical order of their names", "silent wrong data", "[O]",
               RUNTIME + " + " + LEGALIZED, "runtime sorts names; orion.lowering.io names I/O in_NN_*/out_NN_*",
               "tests/compiler/test_lowering.py::test_io_names_sort_in_natural_order"),
    Constraint("ANE-21", "the ANE reads the declared shape packed from offset 0 of a surface", "silent wrong data",
               "[O]", RUNTIME + " + " + LEGALIZED,
               "orion.passes.io_padding pads in the declared shape; CompiledGraph passes packed arrays",
               "tests/compiler/test_compiler.py::test_padding_layout_is_packed"),
    Constraint("ANE-22", "a BLOBFILE offset must point at a chunk header (64 for one tensor)", "silent wrong data",
               "[O]", LEGALIZED, "orion.lowering.mil (one file per weight, offset 64)",
               "tests/compiler/test_lowering.py::test_weights_one_file_offset_64"),
    Constraint("ANE-23", "scaled_dot_product_attention ignores attn_mask", "silent wrong data", "[M][O]",
               LEGALIZED, "orion.lowering.legalize (attention -> matmul, scale, mask add, softmax, matmul)",
               "tests/compiler/test_legalize.py::test_attention"),
    Constraint("ANE-24", "weights are baked at compile: changing them needs a new program", "silent wrong data",
               "[M][O]", REPORTED, "orion.compiler.CompiledGraph.content_hash covers every weight byte",
               "tests/compiler/test_compiler.py::test_hash_changes_with_weights"),
    Constraint("ANE-25", "fp16 overflows to inf past 65504 (NaN cascade in softmax/loss): clamp", "silent wrong data",
               "[O]", REJECTED, "orion.graph.builder.Graph.const rejects constants outside fp16 range",
               "tests/compiler/test_catalog.py::test_ane25_const_overflow"),
    Constraint("ANE-26", "weights + activations over ~32 MB SRAM per program run ~30% slower", "slow", "[M]",
               REPORTED, "orion.passes.sram (report + warning with a split hint)",
               "tests/compiler/test_passes.py::test_sram_over_budget_warns_with_split_hint"),
    Constraint("ANE-27", "matmul with a const operand is ~3x slower than a 1x1 conv", "slow", "[M][O]",
               REPORTED, "orion.passes.sram reports const-operand matmuls; Graph.linear lowers to conv",
               "tests/compiler/test_passes.py::test_sram_reports_const_matmul"),
    Constraint("ANE-28", "every evaluate costs ~0.095 ms of dispatch", "slow", "[M]",
               REPORTED, "orion.passes.sram report (dispatch estimate per program)",
               "tests/compiler/test_passes.py::test_sram_under_budget"),
    Constraint("ANE-29", "slice_by_index is rejected: use slice_by_size", "compile fail", "[E]",
               LEGALIZED, "orion.lowering.legalize (slice -> slice_by_size)", "tests/compiler/test_legalize.py::test_slice_split"),
    Constraint("ANE-30", "real_div is rejected: multiply by a reciprocal", "compile fail", "[E]",
               LEGALIZED, "orion.lowering.legalize (div -> mul by 1/c or pow(y, -1))", "tests/compiler/test_legalize.py::test_div"),
    Constraint("ANE-31", "layer_norm is rejected: decompose into reductions and pow", "compile fail", "[E]",
               LEGALIZED, "orion.lowering.legalize (layer_norm/rms_norm -> reduce_sum, mul, pow)",
               "tests/compiler/test_legalize.py::test_layer_norm"),
    Constraint("ANE-32", "conv needs a const weight and all of dilations/groups/pad/pad_type/strides", "compile fail",
               "[O][M]", REJECTED + " + " + LEGALIZED,
               "orion.graph.infer (linear weight must be const); orion.lowering.mil (all seven args)",
               "tests/compiler/test_catalog.py::test_ane32_linear_weight_must_be_const"),
    Constraint("ANE-33", "programs must always be unloaded, or the ANE leaks", "crash", "[M][O]",
               RUNTIME, "runtime Program destructor (unload)", "runtime tests (Apple backend)"),
    Constraint("ANE-34", "weight paths must be unique @model_path/ relative paths without '..'", "crash", "[O]",
               RUNTIME + " + " + LEGALIZED, "runtime compile validates keys; orion.lowering.mil names "
               "@model_path/weights/<node>.bin", "tests/compiler/test_lowering.py::test_weights_one_file_offset_64"),
    # Found in FACTS.md, not yet in csrc/constraints.h.
    Constraint("ANE-35", "quantize/dequantize ops work on M4 [M] but fail on M3 [E]: keep weights fp16",
               "compile fail", "[M][E]", REJECTED, "orion.graph has no quantized ops; legalize emits fp16 only",
               "tests/compiler/test_catalog.py::test_ane35_no_quantized_ops"),
    Constraint("ANE-36", "load may fail transiently: retry once after 100 ms", "eval fail", "[M]",
               RUNTIME, "runtime load (Apple backend)", "runtime tests (Apple backend)"),
)

BY_ID: dict[str, Constraint] = {c.id: c for c in CATALOG}


def violation(cid: str, node: str, detail: str, fix: str) -> ConstraintError:
    """A :class:`ConstraintError` for entry ``cid`` naming the node, what is wrong and the fix."""
    entry = BY_ID[cid]
    return ConstraintError(f"{cid} ({entry.title}): node '{node}': {detail}. Fix: {fix}", cid)


def format_table() -> str:
    """The catalog as a plain-text table, one row per entry."""
    header = ("id", "title", "symptom", "sources", "handling", "where")
    rows = [header] + [(c.id, c.title, c.symptom, c.sources, c.handling, c.where) for c in CATALOG]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        lead = "  ".join(r[i].ljust(widths[i]) for i in range(4))
        lines.append(f"{lead}  {r[4]}: {r[5]}")
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main() -> int:
    """Entry point of ``python -m orion constraints``."""
    sys.stdout.write(format_table() + "\n")
    return 0
