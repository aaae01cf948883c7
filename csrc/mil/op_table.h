// Every MIL op the core knows, in one table: its argument names and its hardware status. The front
// end's argument checks (frontend/frontend.cpp) and rules (frontend/rules.cpp) and
// orion._core.op_table() all read it; each op's type rule (frontend/types_*.cpp) and emulator kernel
// (emulator/ops_*.cpp) are registered under its name. python/orion's op registry is checked against
// it by a test, and every row's type rule by another.
//
// Status: `allowed` ops form the conservative dialect; `banned` ops are refused under the hardware
// profile with their constraint id and the rewrite in `fix`; `disputed` ops work on some chips and
// not others, so they are refused under the hardware profile unless a probe report run on this
// machine relaxes them (orion.probes.Relaxations.ops). `const` is a statement, not an op: it is
// not in the table.
#pragma once

#include <string>
#include <vector>

#include "constraints.h"

namespace orion::mil {

enum class OpStatus { allowed, banned, disputed };

struct OpSpec {
    const char* name;
    std::vector<std::string> required;  // arguments every use must give
    std::vector<std::string> optional;  // arguments a use may give
    OpStatus status;
    const constraints::Constraint* constraint;  // nullptr when allowed
    const char* fix;                            // how to rewrite a banned/disputed use ("" when allowed)
};

#define ORION_ARGS(...) {__VA_ARGS__}
#define ORION_NO_ARGS {}

// X(name, required, optional, status, constraint key (NONE when allowed), fix)
#define ORION_OPS(X)                                                                                              \
    X(add, ORION_ARGS("x", "y"), ORION_NO_ARGS, allowed, NONE, "")                                              \
    X(sub, ORION_ARGS("x", "y"), ORION_NO_ARGS, allowed, NONE, "")                                              \
    X(mul, ORION_ARGS("x", "y"), ORION_NO_ARGS, allowed, NONE, "")                                              \
    X(pow, ORION_ARGS("x", "y"), ORION_NO_ARGS, allowed, NONE, "")                                              \
    X(tanh, ORION_ARGS("x"), ORION_NO_ARGS, allowed, NONE, "")                                                  \
    X(sigmoid, ORION_ARGS("x"), ORION_NO_ARGS, allowed, NONE, "")                                               \
    X(exp, ORION_ARGS("x"), ORION_NO_ARGS, allowed, NONE, "")                                                   \
    X(relu, ORION_ARGS("x"), ORION_NO_ARGS, allowed, NONE, "")                                                  \
    X(identity, ORION_ARGS("x"), ORION_NO_ARGS, allowed, NONE, "")                                              \
    X(conv, ORION_ARGS("dilations", "groups", "pad", "pad_type", "strides", "weight", "x"), ORION_ARGS("bias"),   \
      allowed, NONE, "")                                                                                          \
    X(matmul, ORION_ARGS("x", "y"), ORION_ARGS("transpose_x", "transpose_y"), allowed, NONE, "")                 \
    X(softmax, ORION_ARGS("x"), ORION_ARGS("axis"), allowed, NONE, "")                                          \
    X(reduce_sum, ORION_ARGS("x"), ORION_ARGS("axes", "keep_dims"), allowed, NONE, "")                          \
    X(reduce_max, ORION_ARGS("x"), ORION_ARGS("axes", "keep_dims"), allowed, NONE, "")                          \
    X(reshape, ORION_ARGS("shape", "x"), ORION_NO_ARGS, allowed, NONE, "")                                      \
    X(transpose, ORION_ARGS("perm", "x"), ORION_NO_ARGS, allowed, NONE, "")                                     \
    X(cast, ORION_ARGS("dtype", "x"), ORION_NO_ARGS, allowed, NONE, "")                                         \
    X(slice_by_size, ORION_ARGS("begin", "size", "x"), ORION_NO_ARGS, allowed, NONE, "")                        \
    X(concat, ORION_ARGS("axis", "values"), ORION_ARGS("interleave"), banned, CONCAT,                           \
      "return the parts as separate outputs")                                                                     \
    X(gelu, ORION_ARGS("x"), ORION_ARGS("mode"), banned, GELU,                                                  \
      "use 0.5*x*(1+tanh(0.7978845608*(x+0.044715*x^3)))")                                                        \
    X(rsqrt, ORION_ARGS("x"), ORION_ARGS("epsilon"), banned, SQRT, "use pow(x, -0.5) with a named fp16 const")  \
    X(sqrt, ORION_ARGS("x"), ORION_NO_ARGS, banned, SQRT, "use pow(x, 0.5) with a named fp16 const")            \
    X(reduce_mean, ORION_ARGS("x"), ORION_ARGS("axes", "keep_dims"), banned, REDUCE_MEAN,                       \
      "use reduce_sum then mul by a 1/N const")                                                                   \
    X(scaled_dot_product_attention, ORION_ARGS("key", "query", "value"), ORION_ARGS("attn_mask"), banned, SDPA, \
      "write matmul, mul by scale, add a causal mask, softmax, matmul")                                           \
    X(slice_by_index, ORION_ARGS("begin", "end", "x"), ORION_ARGS("begin_mask", "end_mask", "squeeze_mask", "stride"), \
      banned, SLICE_BY_INDEX, "use slice_by_size")                                                                \
    X(real_div, ORION_ARGS("x", "y"), ORION_NO_ARGS, banned, REAL_DIV, "mul by a reciprocal const (or pow(y, -1))") \
    X(layer_norm, ORION_ARGS("x"), ORION_ARGS("axes", "beta", "epsilon", "gamma"), banned, LAYER_NORM,          \
      "decompose into reduce_sum, sub, mul, pow, add")                                                            \
    X(quantize, ORION_ARGS("input", "output_dtype", "scale"), ORION_ARGS("axis", "zero_point"), disputed,       \
      QUANTIZED_OPS, "keep the tensor fp16, or relax the op with a probe report from this machine")               \
    X(dequantize, ORION_ARGS("input", "scale"), ORION_ARGS("axis", "zero_point"), disputed, QUANTIZED_OPS,      \
      "keep the tensor fp16, or relax the op with a probe report from this machine")                              \
    X(constexpr_affine_dequantize, ORION_ARGS("axis", "quantized_data", "scale", "zero_point"), ORION_NO_ARGS,  \
      disputed, QUANTIZED_OPS,                                                                                   \
      "store the weight as fp16; or pass relaxed_ops=orion.probes.load_report(PATH).ops from a `python -m orion "  \
      "doctor --probe --out PATH` report of this machine whose quantized_weights probe works; or compile with "    \
      "profile=\"permissive\" (Orion's op bans lifted: a real ANE may refuse it)")                            \
    X(constexpr_lut_to_dense, ORION_ARGS("indices", "lut"), ORION_ARGS("vector_axis"), disputed, LOW_BIT_WEIGHTS, \
      "store the weight as fp16 or int8; or pass relaxed_ops=orion.probes.load_report(PATH).ops from a `python -m "  \
      "orion doctor --probe --out PATH` report of this machine whose lut_weights probe works; or compile with "     \
      "profile=\"permissive\" (Orion's op bans lifted: a real ANE may refuse it)")                              \
    X(constexpr_blockwise_shift_scale, ORION_ARGS("data", "scale"), ORION_ARGS("offset"), disputed,               \
      LOW_BIT_WEIGHTS,                                                                                            \
      "store the weight as fp16, int8 or a LUT; or pass relaxed_ops=orion.probes.load_report(PATH).ops from a "    \
      "`python -m orion doctor --probe --out PATH` report of this machine whose int4_weights probe works; or "     \
      "compile with profile=\"permissive\" (Orion's op bans lifted: a real ANE may refuse it)")

// The table, in the order above.
const std::vector<OpSpec>& op_table();
// The row of `name`, or nullptr for an op the core does not know.
const OpSpec* find_op_spec(const std::string& name);
const char* op_status_name(OpStatus status);  // "allowed", "banned", "disputed"

}  // namespace orion::mil
