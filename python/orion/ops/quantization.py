"""MIL ops the graph never builds but the hardware tables list: the quantization ops. They work on
some chips and fail on others (ANE-35), so a program using them is rejected unless a probe report
relaxes the rule."""

from __future__ import annotations

from orion.ops.base import DISPUTED, MilOp, define_mil_only

define_mil_only(MilOp("quantize", ("input", "output_dtype", "scale"), ("axis", "zero_point"),
                      status=DISPUTED, constraint="ANE-35"))
define_mil_only(MilOp("dequantize", ("input", "scale"), ("axis", "zero_point"), status=DISPUTED, constraint="ANE-35"))
define_mil_only(MilOp("constexpr_affine_dequantize", ("axis", "quantized_data", "scale", "zero_point"),
                      status=DISPUTED, constraint="ANE-35"))
