// Stable ids of the ANE constraints the core enforces or reproduces. The full catalog (symptom on
// hardware, sources, how Orion handles each) lives in python/orion/constraints.py, keyed by these ids.
#pragma once

#include <string>
#include <vector>

namespace orion::constraints {

struct Constraint {
    const char* id;
    const char* title;
};

#define ORION_CONSTRAINTS(X)                                                                           \
    X(CONCAT, "ANE-01", "concat is rejected by the ANE compiler: return several outputs instead")          \
    X(GELU, "ANE-02", "gelu is rejected: use the tanh approximation built from tanh/mul/add")            \
    X(SQRT, "ANE-03", "rsqrt and sqrt are rejected: use pow(x, -0.5) or pow(x, 0.5)")                   \
    X(CONV_BIAS, "ANE-04", "conv with bias= is rejected: add the bias with a separate add")              \
    X(INLINE_LITERAL, "ANE-05", "op arguments must reference named const() values, not inline literals") \
    X(DEAD_RETURN, "ANE-06", "returned names must be values computed by the function")                  \
    X(REDUCE_MEAN, "ANE-07", "reduce_mean is rejected: use reduce_sum times 1/N")                        \
    X(SOFTMAX_EXTENT, "ANE-08", "softmax extent along its axis must be a power of two")                 \
    X(FUSION_DEPTH, "ANE-09", "too many layers fused into one program fail to compile")                  \
    X(CONV_CHANNELS, "ANE-10", "conv with 32,000 or more input channels is rejected")                   \
    X(COMPILE_BUDGET, "ANE-11", "about 119 compiles per process, then compiles fail")                   \
    X(SURFACE_MIN_SIZE, "ANE-12", "every I/O surface must be at least 49,152 bytes")                    \
    X(SURFACE_UNIFORM, "ANE-13", "all input surfaces must have one size, and all output surfaces one size") \
    X(FP16_LANES, "ANE-14", "fp16 I/O tensors need at least 32 lanes in the last dimension")            \
    X(SURFACE_ALIAS, "ANE-15", "one surface must not be bound as two inputs/outputs")                   \
    X(REQUEST_REUSE, "ANE-16", "a request is immutable: build a new one to rebind surfaces")            \
    X(MIL_AS_DATA, "ANE-17", "MIL text must be passed as NSData (UTF-8), not NSString")                  \
    X(WEIGHT_DICT, "ANE-18", "the weight dictionary must be @{} when empty, never nil")                  \
    X(TEMP_DIR, "ANE-19", "the model temp dir with model.mil and weights must exist before compile")    \
    X(BINDING_ORDER, "ANE-20", "inputs and outputs bind in alphabetical order of their names")           \
    X(PACKED_DATA, "ANE-21", "the ANE reads the declared shape packed from offset 0 of a surface")      \
    X(BLOB_OFFSET, "ANE-22", "a BLOBFILE offset must point at a chunk header (64 for one tensor)")       \
    X(SDPA, "ANE-23", "scaled_dot_product_attention ignores attn_mask: use matmul/softmax/matmul")      \
    X(BAKED_WEIGHTS, "ANE-24", "weights are baked at compile: changing them needs a new program")        \
    X(FP16_OVERFLOW, "ANE-25", "fp16 activations overflow to inf past 65504: clamp them")                \
    X(SRAM_BUDGET, "ANE-26", "weights and activations over ~32 MB SRAM per program run ~30% slower")    \
    X(MATMUL_SLOW, "ANE-27", "matmul with a const operand is ~3x slower than a 1x1 conv")               \
    X(DISPATCH_COST, "ANE-28", "every evaluate costs ~0.095 ms of dispatch")                             \
    X(SLICE_BY_INDEX, "ANE-29", "slice_by_index is rejected: use slice_by_size")                         \
    X(REAL_DIV, "ANE-30", "real_div is rejected: multiply by a reciprocal")                              \
    X(LAYER_NORM, "ANE-31", "layer_norm is rejected: decompose it into reductions and pow")              \
    X(CONV_FORM, "ANE-32", "conv needs a const weight and all of dilations/groups/pad/pad_type/strides") \
    X(UNLOAD, "ANE-33", "programs must always be unloaded, or the ANE leaks")                            \
    X(WEIGHT_PATHS, "ANE-34", "weight paths must be unique @model_path/ relative paths without '..'")       \
    X(QUANTIZED_OPS, "ANE-35", "int8 ops are disputed: [M] ran them (attribute form), [E]'s failure used operands") \
    X(LOAD_RETRY, "ANE-36", "load may fail transiently: retry once after 100 ms")                       \
    X(SURFACE_COUNT, "ANE-37", "several input surfaces may fail (0x1d) and more than 6 outputs are unproven: pack I/O") \
    X(LOW_BIT_WEIGHTS, "ANE-38", "4-/6-bit weights are disputed: Core ML runs LUTs (ANEMLL), int4 blockwise was seen to fail")

#define ORION_DECLARE_CONSTRAINT(key, id, title) inline constexpr Constraint key{id, title};
ORION_CONSTRAINTS(ORION_DECLARE_CONSTRAINT)
#undef ORION_DECLARE_CONSTRAINT

inline std::vector<Constraint> all() {
#define ORION_LIST_CONSTRAINT(key, id, title) key,
    return {ORION_CONSTRAINTS(ORION_LIST_CONSTRAINT)};
#undef ORION_LIST_CONSTRAINT
}

}  // namespace orion::constraints
