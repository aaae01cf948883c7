// Compile-time constant folding: an op whose operands are all constants is evaluated once, when the
// program is built, by its own kernel (the kernel and the rounding an evaluate would run), and its
// result becomes a constant of the program. It is exact: the folded value is the one the op computes
// at every evaluate. So a mask the graph generates from position vectors (docs/compiler.md) is, to the
// emulator, the constant it computes, and the fused causal attention recognises it as a stored one.
#pragma once

#include <vector>

#include "emulator/ops.h"
#include "frontend/types.h"
#include "mil/program.h"

namespace orion::emu {

// Elements folded per program at most: the rest is left to the evaluate (folded values are held as
// doubles while the program is built).
constexpr int64_t kMaxFoldedElements = int64_t{1} << 25;  // a 2048-token bucket's generated mask: 24M

// Whether the op reading arg_ids / tuple_ids (value ids, -1 for a tuple argument) with output type
// `out` can be folded: every operand is a const() value (or an inline literal) and the result is a
// float or int32 tensor.
bool foldable(const std::vector<ValueInfo>& values, const std::vector<int>& arg_ids,
              const std::vector<std::vector<int>>& tuple_ids, const mil::Type& out);

// The op's result on its constant operands, as a const value (a list of numbers in `out`'s type):
// its builder's kernel run once on a scratch frame holding the operands, rounded to its dtype.
mil::Value evaluate_constant_op(const mil::Operation& op, const frontend::TypedOp& typed, OpBuilder build,
                                std::vector<ValueInfo>& values, const std::vector<int>& arg_ids,
                                const std::vector<std::vector<int>>& tuple_ids, int out);

}  // namespace orion::emu
