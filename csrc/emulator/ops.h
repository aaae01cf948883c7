// The op library of the software ANE: one builder per op, from the op's type-step results
// (frontend/types.h: its output type and what its type rule derived, OpContext::attrs) to its
// kernel. The emulator calls each builder twice: the plan step (OpContext::plan_only()) asks only
// whether the output is a view and how much scratch the kernel will hold, allocating nothing
// tensor-sized; the kernel step then returns the kernel that computes the op at evaluate time.
// Operand types and attributes were checked by the front end before either step.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <variant>
#include <vector>

#include "emulator/kernels.h"
#include "emulator/tensor.h"
#include "frontend/types.h"
#include "mil/name_index.h"
#include "mil/program.h"

namespace orion::emu {

// Per-program evaluation state: one tensor per MIL variable, allocated once at compile.
struct Frame {
    std::vector<Tensor> values;
    int fallbacks = 0;  // fused groups that ran their own ops instead (the profile names them: kRanItsOps)
};

// The suffix of a fused group's profile row when a call ran the group's own ops (its kernel did not apply).
constexpr const char* kRanItsOps = " (ran its ops)";

using Kernel = std::function<void(Frame&)>;

struct CompressedConst;

// What compile time knows about a variable.
struct ValueInfo {
    mil::Type type;
    int slot = -1;                           // index in Frame::values
    const mil::Value* constant = nullptr;    // set for const() variables
    // Payload bytes of a BLOBFILE const, in the caller's weight file: valid while the program is
    // built (kernels and the frame copy what they need: weights are baked, ANE-24).
    std::optional<std::string_view> blob;
    bool used_as_data = false;               // some kernel reads it: materialise it in the frame
    bool needs_fp32 = false;                 // (on a slot's owner) some kernel reads its fp32 data
    // Set on a constexpr op's output: its stored form, for kernels that read the weight as it is
    // stored (conv keeps int8, LUT and 4-bit weights so). Valid while the program is built.
    std::shared_ptr<const CompressedConst> compressed;
    // A BLOBFILE const's shared-weight key: its file's key (CompileOptions::weight_keys) and offset;
    // empty when the caller gave none (the weight is then shared by content).
    std::string blob_key;
    // Files of this const's packed panels by shaped key (CompileOptions::packed_weights under blob_key).
    std::map<std::string, std::string> packed_files;
    // A folded op's values (const_fold.h: `constant` then holds its type only), shared with every program
    // that folded the same derivation. Valid while the program is built.
    std::shared_ptr<const std::vector<float>> folded;
};

// Scale and zero point per element: a single value, or one per index along the axis.
struct AffineParams {
    std::vector<float> scale, zero;  // zero may be empty (0)
    int64_t n = 1, inner = 1;        // element i uses entry (i / inner) % n

    float s(int64_t i) const { return scale.size() == 1 ? scale[0] : scale[(i / inner) % n]; }
    float z(int64_t i) const { return zero.empty() ? 0.0f : zero.size() == 1 ? zero[0] : zero[(i / inner) % n]; }
};

// A constexpr op's output, known at compile time, in its stored form:
//  - affine (constexpr_affine_dequantize): (q[i] - z(i)) * s(i);
//  - lut (constexpr_lut_to_dense): table[block of i][index[i]];
//  - shift_scale (constexpr_blockwise_shift_scale): (q[i] - offset[block of i]) * scale[block of i].
struct CompressedConst {
    enum class Kind { affine, lut, shift_scale };
    Kind kind = Kind::affine;
    int data = -1;  // the value id of quantized_data / indices / data: a const
    AffineParams params;       // affine
    std::vector<float> table;  // lut: the LUTs, [tables..., entries] row-major; shift_scale: the scales
    std::vector<float> offset;  // shift_scale: the offsets (empty: 0)
    frontend::BlockLayout blocks;  // lut, shift_scale
    mil::Type type;  // the dequantized tensor's
    // A name its stored form alone determines (its BLOBFILE consts' keys, ValueInfo::blob_key, and its few inline
    // values, with the stored dtype and block shape), under which conv's packed weight is shared across programs
    // without hashing or packing it again; empty when some const has no key (a caller that gave no keys).
    std::string key;
};
// Its values in fp32, rounded to the output dtype as the ANE produces them: (q - z) * s (exact for fp16
// scales and integer data), or the LUT's entries.
std::vector<float> dequantize(const CompressedConst& c, const ValueInfo& data);
// The index of the table (lut) or scale (shift_scale) entry element i of a tensor of `shape` reads.
int64_t block_entry(const frontend::BlockLayout& blocks, const mil::Type& type, int64_t i);

class OpContext {
public:
    OpContext(const mil::Operation& op, const frontend::TypedOp& typed, std::vector<ValueInfo>& values,
              const std::vector<int>& arg_ids, const std::vector<std::vector<int>>& tuple_ids, int out_slot,
              bool plan_only)
        : op_(op), typed_(typed), values_(values), arg_ids_(arg_ids), tuple_ids_(tuple_ids), out_slot_(out_slot),
          plan_only_(plan_only) {}

    const mil::Operation& op() const { return op_; }
    // The plan step: the builder returns once it knows whether its output is a view, and its scratch.
    bool plan_only() const { return plan_only_; }
    int out_slot() const { return out_slot_; }
    const mil::Type& out_type() const { return typed_.type; }
    // What the op's type rule derived (frontend/types.h), e.g. attrs<frontend::ConvGeometry>().
    template <typename T>
    const T& attrs() const { return std::get<T>(typed_.attrs); }
    bool has(const char* arg) const;

    // A runtime operand: its slot (the kernel reads Frame::values[slot]) and type. With
    // fp16_in_place the kernel also accepts the operand as Tensor::half (see tensor.h).
    int slot(const char* arg, bool fp16_in_place = false);
    const mil::Type& type(const char* arg) const;
    std::vector<int> tuple_slots(const char* arg);
    // Compile-time constant arguments (const() values, as the type step checked).
    const ValueInfo& constant(const char* arg) const;
    // The stored form of a constexpr op's output operand, or nullptr for any other value.
    const CompressedConst* compressed(const char* arg) const { return info(arg).compressed.get(); }
    const ValueInfo& value(int id) const { return values_[static_cast<size_t>(id)]; }
    std::vector<float> floats(const char* arg) const;  // a whole const tensor as fp32

    // Throws CompileError naming the op, its line and `message`.
    [[noreturn]] void fail(const std::string& message) const;

private:
    const ValueInfo& info(const char* arg) const;
    const mil::Operation& op_;
    const frontend::TypedOp& typed_;
    std::vector<ValueInfo>& values_;
    const std::vector<int>& arg_ids_;  // per op argument: value id (-1 for tuples)
    const std::vector<std::vector<int>>& tuple_ids_;
    int out_slot_;
    bool plan_only_;
};

// A pointwise conv over one block of lanes of its [1, C, 1, S] operand (lane_blocks.h): out[o*out_stride + s]
// for s < lanes from x[c*x_stride + s], each value computed as the op's kernel computes it.
using LaneBlockKernel = std::function<void(const float* x, int64_t x_stride, float* out, int64_t out_stride,
                                           int64_t lanes)>;

struct BuiltOp {
    Kernel kernel;
    int view_of = -1;  // >= 0: no kernel, the output is a view of this slot's data (same order)
    double scratch_bytes = 0;  // plan step: memory the kernel step holds besides the frame (tables, copies)
    // plan step of a constexpr op: its output's compile-time value (ValueInfo::compressed)
    std::shared_ptr<const CompressedConst> compressed;
    // kernel step of a 1x1 conv of one image with one row per channel ([1, C, 1, S]): its lane-block form
    LaneBlockKernel lane_block;
};

using OpBuilder = BuiltOp (*)(OpContext&);

// The builder of `op`, or nullptr when the emulator does not know the op.
OpBuilder find_op(const std::string& op);

// Registration, one call per ops_*.cpp file (see ops.cpp).
using OpEntry = mil::Registration<OpBuilder>;
std::vector<OpEntry> elementwise_ops();
std::vector<OpEntry> tensor_ops();
std::vector<OpEntry> linear_ops();
std::vector<OpEntry> reduction_ops();
std::vector<OpEntry> quantization_ops();

// Shared helpers for op builders.
// A BLOBFILE const's payload as fp32 values, decoded by its dtype.
std::vector<float> blob_floats(const ValueInfo& v);
// A const's values as fp32: a BLOBFILE's decoded, a folded op's, or a literal's as written (not rounded).
std::vector<float> const_values(const ValueInfo& v);
// Rounds a freshly computed tensor to its dtype: fp16 rounding, or whole numbers for integers.
void finish(Tensor& t);

}  // namespace orion::emu
