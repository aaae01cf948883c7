// The ANE's numeric limits, in one place (docs/hardware.md gives the sources). Python reads them
// through `orion.limits`; no other file writes these numbers as literals.
#pragma once

#include <cstddef>
#include <cstdint>

namespace orion::limits {

#define ORION_HARDWARE_LIMITS(X)                                                                      \
    X(MIN_SURFACE_BYTES, size_t, 49152, "smallest I/O surface the ANE evaluates (ANE-12)")                \
    X(MIN_LANES_FP16, int, 32, "fewest lanes (last dim) of an fp16 I/O tensor (ANE-14)")                  \
    X(MIN_LANES_FP32, int, 16, "fewest lanes (last dim) of an fp32 I/O tensor (ANE-14)")                  \
    X(MAX_CONV_INPUT_CHANNELS, int, 32000, "conv input channels from which the compiler refuses (ANE-10)") \
    X(SRAM_BYTES, size_t, 33554432, "on-chip SRAM a program's working set should fit (ANE-26)")           \
    X(DEFAULT_COMPILE_BUDGET, int, 119, "compiles per process before the ANE fails (ANE-11)")             \
    X(COMPILE_STOP_MARGIN, int, 4, "compiles kept unused under the default budget (libane stops at 115)")  \
    X(COMPILE_WARN_AT, int, 100, "compiles after which a process is warned of the budget (libane: 100)")   \
    X(DISPATCH_MS, double, 0.095, "cost of one evaluate's dispatch in milliseconds (ANE-28)")             \
    X(FP16_MAX, double, 65504.0, "largest finite fp16 value; beyond it activations overflow (ANE-25)")   \
    X(MAX_INPUT_SURFACES, size_t, 1, "input surfaces of a program until a probe proves more (ANE-37)")     \
    X(MAX_OUTPUT_SURFACES, size_t, 6, "output surfaces of a program until a probe proves more (ANE-37)")  \
    X(MAX_IO_LANES, int, 16384, "widest lane axis the I/O packing gives a surface (one source's maximum dimension)")

// What the core accepts from a caller, whatever the hardware could do: inputs past these are refused
// with an error naming the limit, before anything is allocated. Every tensor type (I/O, op result,
// const) is held to the rank, dimension and element limits. MIL's grammar nests to a fixed depth
// (program { func { statement; } }, flat tuples and lists), so no nesting limit is needed.
#define ORION_INPUT_LIMITS(X)                                                                          \
    X(MAX_MIL_TEXT_BYTES, size_t, 67108864, "largest MIL text orion.compile parses (64 MiB)")            \
    X(MAX_OPS, size_t, 200000, "most statements (ops and consts) in one MIL function")                    \
    X(MAX_RANK, size_t, 8, "highest tensor rank")                                                        \
    X(MAX_DIM, int64_t, 2147483647, "largest tensor dimension (int32 range)")                            \
    X(MAX_ELEMENTS, int64_t, 2147483648, "most elements in one tensor (2^31)")                            \
    X(MAX_WEIGHT_FILES, size_t, 100000, "most weight files in one compile")

#define ORION_DECLARE_LIMIT(name, type, value, doc) inline constexpr type name = value;
ORION_HARDWARE_LIMITS(ORION_DECLARE_LIMIT)
ORION_INPUT_LIMITS(ORION_DECLARE_LIMIT)
#undef ORION_DECLARE_LIMIT

}  // namespace orion::limits
