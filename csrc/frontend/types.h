// The front end's type step: each op's type rule checks its operands (ranks, dtypes, shapes, const
// arguments) and infers its output type, which must equal the declared one. It is the one place an
// op's type rule lives: both backends run it (frontend::check), and the emulator builds its kernels
// from what the rules derive (TypedOp::attrs) instead of deriving it again. The rules are grouped
// by family like the kernels (types_<family>.cpp); argument names were already checked against the
// op table (mil/op_table.h). Nothing tensor-sized is allocated and no weight payload is read.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "mil/name_index.h"
#include "mil/program.h"

namespace orion::frontend {

using Shape = std::vector<int64_t>;

// What the rules derive beyond the output type, by op family.
struct GeluMode {  // gelu
    enum class Kind { exact, tanh_approximation, sigmoid_approximation } kind = Kind::exact;
};
struct Epsilon {  // rsqrt
    float value = 0.0f;
};
struct Permutation {  // transpose: perm with every axis non-negative
    std::vector<int64_t> perm;
};
struct Slice {  // slice_by_size, slice_by_index: the box [begin, begin + extent * stride) of x, per axis
    std::vector<int64_t> begin, stride;
    Shape extent;  // before squeeze_mask drops axes
};
struct Concat {
    int64_t axis = 0;  // non-negative
    bool interleave = false;
    std::vector<int64_t> widths;  // each value's extent along axis
};
struct ConvGeometry {
    int64_t n, cin, h, w, cout, kh, kw, groups, sh, sw, dh, dw, pt, pb, pl, pr, oh, ow;
};
struct MatmulDims {  // op(x) [..., M, K] times op(y) [..., K, N]
    bool transpose_x = false, transpose_y = false;
    int64_t M = 0, K = 0, N = 0;
    Shape batch, x_batch, y_batch;  // the broadcast batch shape and each operand's own
};
struct Reduction {  // reduce_*, and the normalised axes of layer_norm
    std::vector<int64_t> axes;  // sorted, unique, non-negative
    int64_t count = 1;          // elements per reduced group
};
struct Normalization {  // layer_norm
    Reduction reduced;
    float epsilon = 0.0f;
};
struct Axis {  // softmax: non-negative
    int64_t axis = 0;
};
struct Attention {  // scaled_dot_product_attention: query [..., L, E], key [..., S, E], value [..., S, Ev]
    int64_t L = 0, E = 0, S = 0, Ev = 0;
    Shape batch;
};
struct AffineLayout {  // quantize, dequantize, constexpr_affine_dequantize: element i uses entry (i / inner) % n
    int64_t n = 1, inner = 1;
};

// constexpr_lut_to_dense, constexpr_blockwise_shift_scale: element [i0, i1, ...] reads the table (lut) or
// scale/offset entry [i0 / block[0], i1 / block[1], ...]; a LUT has `entries` (2^bits) values per table.
struct BlockLayout {
    Shape block;
    int64_t entries = 0;
};

using OpAttrs = std::variant<std::monostate, GeluMode, Epsilon, Permutation, Slice, Concat, ConvGeometry, MatmulDims,
                             Reduction, Normalization, Axis, Attention, AffineLayout, BlockLayout>;

// One statement after the type step.
struct TypedOp {
    mil::Type type;  // the output type, inferred (and equal to the declaration)
    OpAttrs attrs;
};

// The type step over a function whose statements passed the front end's other checks: one TypedOp
// per statement of fn.body, in order (a const's is its declared type). Throws CompileError naming
// the op, its line and the fix.
std::vector<TypedOp> check_types(const mil::Function& fn);

// Whether a family defines the type rule of `op` (every op of the op table must have one).
bool has_type_rule(const std::string& op);

// What the type step knows about a variable: its type, and its value when it is a const.
struct Operand {
    const mil::Type* type = nullptr;
    const mil::Value* constant = nullptr;
};

// One op's arguments as its type rule reads them.
class TypeContext {
public:
    TypeContext(const mil::Operation& op, const std::unordered_map<std::string, Operand>& names)
        : op_(op), names_(names) {}

    const mil::Operation& op() const { return op_; }
    bool has(const char* arg) const { return op_.arg(arg) != nullptr; }
    const mil::Type& type(const char* arg) const { return *single(arg).type; }
    std::vector<mil::Type> tuple_types(const char* arg) const;
    // Compile-time constant arguments (must be const() values).
    Operand constant(const char* arg) const;
    int64_t count(const char* arg) const;  // the number of values a const holds
    std::vector<int64_t> ints(const char* arg) const;
    int64_t int_scalar(const char* arg) const;
    double number(const char* arg) const;  // a numeric scalar or one-element tensor
    bool boolean(const char* arg) const;
    std::string text(const char* arg) const;

    // Throws CompileError naming the op, its line and `message`.
    [[noreturn]] void fail(const std::string& message) const;

private:
    Operand single(const char* arg) const;
    Operand named(const std::string& name) const { return names_.at(name); }  // defined before use (front end)
    const mil::Operation& op_;
    const std::unordered_map<std::string, Operand>& names_;
};

// Shared helpers of the rules.
Shape broadcast_shapes(const TypeContext& ctx, const Shape& a, const Shape& b);
// Normalises a possibly negative axis against `rank`; fails with the op's name when out of range.
int64_t normalize_axis(const TypeContext& ctx, int64_t axis, int64_t rank);

// Registration, one call per types_*.cpp file (see types.cpp).
using TypeRule = TypedOp (*)(const TypeContext&);
using TypeRuleEntry = mil::Registration<TypeRule>;
std::vector<TypeRuleEntry> elementwise_types();
std::vector<TypeRuleEntry> tensor_types();
std::vector<TypeRuleEntry> linear_types();
std::vector<TypeRuleEntry> reduction_types();
std::vector<TypeRuleEntry> quantization_types();

}  // namespace orion::frontend
