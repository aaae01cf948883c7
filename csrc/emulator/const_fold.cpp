// Compile-time constant folding (see const_fold.h).
#include "emulator/const_fold.h"

namespace orion::emu {

namespace {

// Every value id an op reads.
std::vector<int> operand_ids(const std::vector<int>& arg_ids, const std::vector<std::vector<int>>& tuple_ids) {
    std::vector<int> ids;
    for (size_t a = 0; a < arg_ids.size(); ++a) {
        if (arg_ids[a] >= 0) ids.push_back(arg_ids[a]);
        ids.insert(ids.end(), tuple_ids[a].begin(), tuple_ids[a].end());
    }
    return ids;
}

// A const's values in the frame, as the evaluate materialises them (fp16 rounded, integers whole).
void load_constant(const ValueInfo& v, Tensor& t) {
    t.dtype = v.type.dtype, t.shape = v.type.shape, t.lanes = t.last_dim();
    if (v.blob)
        t.data = blob_floats(v);
    else
        t.data.assign(v.constant->numbers.begin(), v.constant->numbers.end());
    finish(t);
}

}  // namespace

bool foldable(const std::vector<ValueInfo>& values, const std::vector<int>& arg_ids,
              const std::vector<std::vector<int>>& tuple_ids, const mil::Type& out) {
    if (!out.is_tensor) return false;
    if (!mil::is_float(out.dtype) && out.dtype != mil::DType::int32) return false;
    const std::vector<int> ids = operand_ids(arg_ids, tuple_ids);
    if (ids.empty()) return false;
    for (int id : ids)
        if (values[static_cast<size_t>(id)].constant == nullptr) return false;
    return true;
}

mil::Value evaluate_constant_op(const mil::Operation& op, const frontend::TypedOp& typed, OpBuilder build,
                                std::vector<ValueInfo>& values, const std::vector<int>& arg_ids,
                                const std::vector<std::vector<int>>& tuple_ids, int out) {
    Frame frame;
    frame.values.resize(values.size());
    for (int id : operand_ids(arg_ids, tuple_ids))
        load_constant(values[static_cast<size_t>(id)], frame.values[static_cast<size_t>(values[static_cast<size_t>(id)].slot)]);
    OpContext ctx(op, typed, values, arg_ids, tuple_ids, out, /*plan_only=*/false);
    BuiltOp built = build(ctx);
    const mil::Type& type = values[static_cast<size_t>(out)].type;
    Tensor& result = frame.values[static_cast<size_t>(out)];
    if (built.view_of >= 0) {
        result.data = frame.values[static_cast<size_t>(built.view_of)].data;  // the same values in the same order
    } else {
        result.dtype = type.dtype, result.shape = type.shape, result.lanes = result.last_dim();
        result.data.assign(static_cast<size_t>(type.element_count()), 0.0f);
        built.kernel(frame);
    }
    return mil::Value::list(type, std::vector<double>(result.data.begin(), result.data.end()));
}

}  // namespace orion::emu
