"""The numbered catalog of known ANE constraints and how Orion handles each one.

Ids and titles come from the native core (``csrc/constraints.h``, the one list both the C++ rules and
this catalog use); each entry here adds the symptom, sources and handling.
``python -m orion constraints`` prints :func:`format_table`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from orion import _core
from orion.errors import ConstraintError

TITLES: dict[str, str] = dict(_core.constraint_ids())

# Handling kinds.
REJECTED = "rejected before compile"
LEGALIZED = "legalized"
RUNTIME = "enforced by the runtime"
REPORTED = "reported"


@dataclass(frozen=True)
class Constraint:
    """One catalog entry: what breaks on hardware, who saw it, and what Orion does about it."""

    id: str
    symptom: str  # "compile fail" | "eval fail" | "crash" | "silent wrong data" | "slow"
    sources: str  # "[O]", "[M]", "[E]" tags of docs/hardware.md
    handling: str  # one of REJECTED / LEGALIZED / RUNTIME / REPORTED (or two joined by " + ")
    where: str  # module/function that does it
    test: str  # the test that shows the handling

    @property
    def title(self) -> str:
        return TITLES[self.id]


CATALOG: tuple[Constraint, ...] = (
    Constraint("ANE-01", "compile fail", "[O] ([M][E] saw it work)",
               LEGALIZED, "orion.ops legalizations (concat -> zero-padding convs + add)",
               "tests/compiler/test_legalize.py::test_concat"),
    Constraint("ANE-02", "compile fail", "[O][E]",
               LEGALIZED, "orion.ops legalizations (gelu -> tanh/mul/add)", "tests/compiler/test_legalize.py::test_gelu"),
    Constraint("ANE-03", "compile fail", "[E]",
               LEGALIZED, "orion.ops legalizations (rsqrt/sqrt -> pow)", "tests/compiler/test_legalize.py::test_rsqrt_sqrt"),
    Constraint("ANE-04", "compile fail", "[O]",
               LEGALIZED, "orion.ops legalizations (linear -> conv + add)", "tests/compiler/test_legalize.py::test_linear_bias"),
    Constraint("ANE-05", "compile fail", "[O]",
               LEGALIZED, "orion.emit.to_program (every argument is a named const)",
               "tests/compiler/test_lowering.py::test_no_inline_literals"),
    Constraint("ANE-06", "compile fail", "[O]",
               LEGALIZED, "orion.passes.dce keeps outputs live; orion.emit names each output var",
               "tests/compiler/test_lowering.py::test_outputs_are_live_ops"),
    Constraint("ANE-07", "compile fail", "[E] ([O] saw it work)",
               LEGALIZED, "orion.ops legalizations (reduce_mean -> reduce_sum * 1/N)",
               "tests/compiler/test_legalize.py::test_reduce_mean"),
    Constraint("ANE-08", "compile fail", "[E]",
               REJECTED, "orion.ops inference (softmax, attention)", "tests/compiler/test_catalog.py::test_ane08_softmax_extent"),
    Constraint("ANE-09", "compile fail", "[E]",
               REJECTED, "orion.legalize.check.check_fusion_depth (attention count > max_layers)",
               "tests/compiler/test_catalog.py::test_ane09_fusion_depth"),
    Constraint("ANE-10", "compile fail", "[M]",
               REJECTED, "orion.ops inference (linear)", "tests/compiler/test_catalog.py::test_ane10_conv_channels"),
    Constraint("ANE-11", "compile fail", "[M][O]", RUNTIME + " + " + REPORTED,
               "runtime compile budget (orion.CompileBudgetExhausted); orion.compiler caches programs by content hash",
               "tests/compiler/test_compiler.py::test_compile_cache_by_hash"),
    Constraint("ANE-12", "eval fail", "[O][E] ([M] saw 8 KB on M5)",
               LEGALIZED, "orion.passes.io_padding", "tests/compiler/test_passes.py::test_io_padding_min_size_and_lanes"),
    Constraint("ANE-13", "eval fail", "[O] ([E] used mixed sizes)",
               RUNTIME, "orion.Program.allocate_surfaces pads every input (and every output) surface to the largest; "
               "the runtime refuses mixed sizes", "tests/compiler/test_passes.py::test_io_padding_leaves_uniform_sizes_to_the_surfaces"),
    Constraint("ANE-14", "eval fail", "[E]",
               LEGALIZED, "orion.passes.io_padding", "tests/compiler/test_passes.py::test_io_padding_lanes"),
    Constraint("ANE-15", "eval fail", "[E]",
               RUNTIME, "runtime evaluate (orion.Program.__call__ allocates one surface per I/O); "
               "orion.compiler.CompiledGraph copies every array", "tests/test_rules.py::test_one_surface_bound_twice_fails"),
    Constraint("ANE-16", "eval fail", "[E]",
               RUNTIME, "ane_client.mm evaluate (new request per call)",
               "tests/harness/test_harness.py::test_ane16_a_new_request_per_evaluate"),
    Constraint("ANE-17", "crash", "[O]",
               RUNTIME, "ane_client.mm compile (NSData); orion.compiler hands UTF-8 text",
               "tests/harness/test_harness.py::test_ane17_mil_must_be_nsdata"),
    Constraint("ANE-18", "crash", "[O][M]",
               RUNTIME, "runtime compile; orion.emit returns {} (never None) without weights",
               "tests/compiler/test_lowering.py::test_weights_dict_empty_not_none"),
    Constraint("ANE-19", "crash", "[O]",
               RUNTIME, "runtime.ane_plan.write_model_dir before compile (ane_client.mm)",
               "tests/harness/test_harness.py::test_ane19_temp_dir_must_exist_before_compile"),
    Constraint("ANE-20", "silent wrong data", "[O]",
               RUNTIME + " + " + LEGALIZED, "runtime sorts names; orion.legalize.io names I/O in_NN_*/out_NN_*",
               "tests/compiler/test_lowering.py::test_io_names_sort_in_natural_order"),
    Constraint("ANE-21", "silent wrong data",
               "[O]", RUNTIME + " + " + LEGALIZED,
               "orion.passes.io_padding pads in the declared shape; CompiledGraph passes packed arrays",
               "tests/compiler/test_compiler.py::test_padding_layout_is_packed"),
    Constraint("ANE-22", "silent wrong data",
               "[O]", LEGALIZED, "orion.emit (one file per weight, offset 64)",
               "tests/compiler/test_lowering.py::test_weights_one_file_offset_64"),
    Constraint("ANE-23", "silent wrong data", "[M][O]",
               LEGALIZED, "orion.ops legalizations (attention -> matmul, scale, mask add, softmax, matmul)",
               "tests/compiler/test_legalize.py::test_attention"),
    Constraint("ANE-24", "silent wrong data",
               "[M][O]", REPORTED, "orion.compiler.CompiledGraph.content_hash covers every weight byte",
               "tests/compiler/test_compiler.py::test_hash_changes_with_weights"),
    Constraint("ANE-25", "silent wrong data",
               "[O]", REJECTED, "orion.graph.builder.Graph.const rejects constants outside fp16 range",
               "tests/compiler/test_catalog.py::test_ane25_const_overflow"),
    Constraint("ANE-26", "slow", "[M]",
               REPORTED, "orion.passes.sram (report + warning with a split hint)",
               "tests/compiler/test_passes.py::test_sram_over_budget_warns_with_split_hint"),
    Constraint("ANE-27", "slow", "[M][O]",
               REPORTED, "orion.passes.sram reports const-operand matmuls; Graph.linear lowers to conv",
               "tests/compiler/test_passes.py::test_sram_reports_const_matmul"),
    Constraint("ANE-28", "slow", "[M]",
               REPORTED, "orion.passes.sram report (dispatch estimate per program)",
               "tests/compiler/test_passes.py::test_sram_under_budget"),
    Constraint("ANE-29", "compile fail", "[E]",
               LEGALIZED, "orion.ops legalizations (slice -> slice_by_size)", "tests/compiler/test_legalize.py::test_slice_split"),
    Constraint("ANE-30", "compile fail", "[E]",
               LEGALIZED, "orion.ops legalizations (div -> mul by 1/c or pow(y, -1))", "tests/compiler/test_legalize.py::test_div"),
    Constraint("ANE-31", "compile fail", "[E]",
               LEGALIZED, "orion.ops legalizations (layer_norm/rms_norm -> reduce_sum, mul, pow)",
               "tests/compiler/test_legalize.py::test_layer_norm"),
    Constraint("ANE-32", "compile fail",
               "[O][M]", REJECTED + " + " + LEGALIZED,
               "orion.ops inference (a conv weight must be const; linear with a runtime [1, Cout, 1, Cin] weight "
               "legalizes to matmul); orion.emit (all seven args)",
               "tests/compiler/test_catalog.py::test_ane32_linear_weight_must_be_const"),
    Constraint("ANE-33", "crash", "[M][O]",
               RUNTIME, "ane_client.mm: unload in unload(), the destructor and every error path",
               "tests/harness/test_harness.py::test_ane33_programs_are_unloaded_on_every_path"),
    Constraint("ANE-34", "crash", "[O]",
               RUNTIME + " + " + LEGALIZED, "runtime compile validates keys; orion.emit names "
               "@model_path/weights/<node>.bin", "tests/compiler/test_lowering.py::test_weights_one_file_offset_64"),
    Constraint("ANE-35", "compile fail", "[M][E]", REJECTED, "disputed ops in csrc/mil/op_table.h, refused unless relaxed_ops",
               "tests/test_rules.py::test_ane35_quantized_ops_are_refused_unless_a_probe_relaxed_them"),
    Constraint("ANE-36", "eval fail", "[M]",
               RUNTIME, "runtime.ane_plan.load_with_retry (ane_client.mm load)",
               "tests/harness/test_harness.py::test_ane36_load_is_retried_once_after_100ms"),
    Constraint("ANE-37", "eval fail", "[M] ([O] ran 3 inputs and 6 outputs, [E] 4 inputs; disputed)",
               LEGALIZED + " + " + REJECTED,
               "orion.passes.io_packing packs inputs into one surface and outputs of one size together; the front end "
               "refuses more surfaces than allowed (1 in, 6 out) unless surface_counts from a probe report relax it",
               "tests/compiler/test_io_packing.py::test_hardware_profile_refuses_more_surfaces_than_proven"),
    Constraint("ANE-38", "compile fail", "[AN][CT] (disputed: Core ML runs LUTs on the ANE; int4 block-wise reported to fail)",
               REJECTED, "constexpr_lut_to_dense / constexpr_blockwise_shift_scale are disputed ops in "
               "csrc/mil/op_table.h, refused unless relaxed_ops (probes lut_weights, int4_weights)",
               "tests/test_low_bit.py::test_ane38_low_bit_weights_are_refused_unless_relaxed"),
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
