"""MIL ops the graph never builds but the hardware tables list: the quantization ops. They work on
some chips and fail on others (ANE-35 for int8, ANE-38 for the iOS 18 LUT and block-wise ops), so a
program using them is rejected unless a probe report relaxes the rule. Quantized weights reach MIL
through ``orion.emit`` (a const's ``attrs["quantized"]``), not as graph ops."""

from __future__ import annotations

from orion.ops.base import DISPUTED, MilOp, define_mil_only

define_mil_only(MilOp("quantize", ("input", "output_dtype", "scale"), ("axis", "zero_point"),
                      status=DISPUTED, constraint="ANE-35"))
define_mil_only(MilOp("dequantize", ("input", "scale"), ("axis", "zero_point"), status=DISPUTED, constraint="ANE-35"))
define_mil_only(MilOp("constexpr_affine_dequantize", ("axis", "quantized_data", "scale", "zero_point"),
                      status=DISPUTED, constraint="ANE-35"))
define_mil_only(MilOp("constexpr_lut_to_dense", ("indices", "lut"), ("vector_axis",), status=DISPUTED,
                      constraint="ANE-38"))
define_mil_only(MilOp("constexpr_blockwise_shift_scale", ("data", "scale"), ("offset",), status=DISPUTED,
                      constraint="ANE-38"))
