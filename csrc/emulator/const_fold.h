// Compile-time constant folding: an op whose operands are all constants is evaluated once, when the
// program is built, by its own kernel (the kernel and the rounding an evaluate would run), and its
// result becomes a constant of the program. It is exact: the folded value is the one the op computes
// at every evaluate. So a mask the graph generates from position vectors (docs/compiler.md) is, to the
// emulator, the constant it computes, and the fused causal attention recognises it as a stored one.
//
// A folded value is also found again by its derivation (`fold_key`: the op, its output type and its
// operands' derivations down to the bytes of small consts), process-wide, while a program holds it:
// the layer programs of a prefill bucket each generate the same [S, S] mask, and all but the first take
// the first's values (held once by the fused attention) instead of computing the six ops again.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "emulator/ops.h"
#include "frontend/types.h"
#include "mil/program.h"

namespace orion::emu {

// Elements folded per program at most: the rest is left to the evaluate.
constexpr int64_t kMaxFoldedElements = int64_t{1} << 25;  // a 2048-token bucket's generated mask: 24M

// Every value id an op reads: its single operands' (arg_ids, -1 for a tuple argument) and its tuples'.
std::vector<int> operand_ids(const std::vector<int>& arg_ids, const std::vector<std::vector<int>>& tuple_ids);

// Whether the op reading arg_ids / tuple_ids (value ids, -1 for a tuple argument) with output type
// `out` can be folded: every operand is a const() value (or an inline literal) and the result is a
// float or int32 tensor.
bool foldable(const std::vector<ValueInfo>& values, const std::vector<int>& arg_ids,
              const std::vector<std::vector<int>>& tuple_ids, const mil::Type& out);

// The op's result on its constant operands, as fp32 values in `out`'s type: its builder's kernel run
// once on a scratch frame holding the operands, rounded to its dtype as the kernel rounds it.
std::vector<float> evaluate_constant_op(const mil::Operation& op, const frontend::TypedOp& typed, OpBuilder build,
                                        std::vector<ValueInfo>& values, const std::vector<int>& arg_ids,
                                        const std::vector<std::vector<int>>& tuple_ids, int out);

// The derivation of a foldable op's result: a string that determines its values exactly (the op, its
// output type, and each operand's derivation: `*keys[id]` for an operand folded in this program (set
// for those only), the dtype, shape and bytes of a stored or literal const of at most
// kMaxKeyedConstBytes), compared whole, never hashed. Empty when there is none that short (a large const
// operand, an operand without one, attributes): such a value is computed in each program.
constexpr size_t kMaxKeyedConstBytes = size_t{1} << 16;
std::string fold_key(const mil::Operation& op, const frontend::TypedOp& typed, const std::vector<ValueInfo>& values,
                     const std::vector<int>& arg_ids, const std::vector<std::vector<int>>& tuple_ids,
                     const std::vector<std::optional<std::string>>& keys);

// The values folded under `key` that some program still holds, or nullptr.
std::shared_ptr<const std::vector<float>> find_folded(const std::string& key);
// Records `values` as folded under `key` (while something holds them) and returns them, or the values
// another thread recorded under that key meanwhile (the same values: the derivation determines them).
std::shared_ptr<const std::vector<float>> keep_folded(const std::string& key,
                                                      std::shared_ptr<const std::vector<float>> values);
// (folded values some program holds, their bytes)
std::pair<int64_t, int64_t> folded_usage();

}  // namespace orion::emu
