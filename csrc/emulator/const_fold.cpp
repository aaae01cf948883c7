// Compile-time constant folding (see const_fold.h).
#include "emulator/const_fold.h"

#include <map>
#include <mutex>

#include "emulator/shared_consts.h"

namespace orion::emu {

namespace {

// A const's values in the frame, as the evaluate materialises them (fp16 rounded, integers whole).
void load_constant(const ValueInfo& v, Tensor& t) {
    t.dtype = v.type.dtype, t.shape = v.type.shape, t.lanes = t.last_dim();
    t.data = const_values(v);
    finish(t);
}

// Appends `field` length-prefixed, so that a concatenation of fields reads back one way only.
void append_field(std::string& key, std::string_view field) {
    key += std::to_string(field.size());
    key += ':';
    key += field;
}

// A stored or literal const's derivation: its kind, type and bytes (empty when over the size limit).
std::string const_key(const ValueInfo& v) {
    std::string key = v.blob ? "b" : "l";
    append_field(key, v.type.str());
    if (v.blob) {
        if (v.blob->size() > kMaxKeyedConstBytes) return "";
        append_field(key, *v.blob);
        return key;
    }
    const std::vector<double>& numbers = v.constant->numbers;
    if (numbers.size() * sizeof(double) + v.constant->text.size() > kMaxKeyedConstBytes) return "";
    append_field(key, std::string_view(reinterpret_cast<const char*>(numbers.data()), numbers.size() * sizeof(double)));
    append_field(key, v.constant->text);
    return key;
}

// Derivations longer than this are not shared (an op reading one folded value twice doubles its key).
constexpr size_t kMaxKeyBytes = size_t{1} << 20;

struct Folded {
    std::mutex mutex;
    std::map<std::string, std::weak_ptr<const std::vector<float>>> by_key;
};

Folded& folded() {
    static Folded* f = new Folded;  // never destroyed: programs may outlive static destruction order
    return *f;
}

}  // namespace

std::vector<int> operand_ids(const std::vector<int>& arg_ids, const std::vector<std::vector<int>>& tuple_ids) {
    std::vector<int> ids;
    for (size_t a = 0; a < arg_ids.size(); ++a) {
        if (arg_ids[a] >= 0) ids.push_back(arg_ids[a]);
        ids.insert(ids.end(), tuple_ids[a].begin(), tuple_ids[a].end());
    }
    return ids;
}

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

std::vector<float> evaluate_constant_op(const mil::Operation& op, const frontend::TypedOp& typed, OpBuilder build,
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
    if (built.view_of >= 0) return frame.values[static_cast<size_t>(built.view_of)].data;  // the same values in the same order
    result.dtype = type.dtype, result.shape = type.shape, result.lanes = result.last_dim();
    result.data.assign(static_cast<size_t>(type.element_count()), 0.0f);
    built.kernel(frame);
    finish(result);  // (the kernel rounds already: this holds the documented form whatever the op)
    return std::move(result.data);
}

std::string fold_key(const mil::Operation& op, const frontend::TypedOp& typed, const std::vector<ValueInfo>& values,
                     const std::vector<int>& arg_ids, const std::vector<std::vector<int>>& tuple_ids,
                     const std::vector<std::optional<std::string>>& keys) {
    if (!op.attributes.empty()) return "";
    std::string key = "f";
    append_field(key, op.op);
    append_field(key, typed.type.str());
    for (size_t a = 0; a < arg_ids.size(); ++a) {
        append_field(key, op.args[a].name);
        std::vector<int> ids = tuple_ids[a];
        if (arg_ids[a] >= 0) ids.push_back(arg_ids[a]);
        key += arg_ids[a] >= 0 ? 's' : 't';  // a single operand or a tuple
        append_field(key, std::to_string(ids.size()));
        for (int id : ids) {
            const std::optional<std::string>& folded_here = keys[static_cast<size_t>(id)];
            const std::string operand = folded_here ? *folded_here : const_key(values[static_cast<size_t>(id)]);
            if (operand.empty() || key.size() + operand.size() > kMaxKeyBytes) return "";
            append_field(key, operand);
        }
    }
    return key;
}

std::shared_ptr<const std::vector<float>> find_folded(const std::string& key) {
    Folded& f = folded();
    std::lock_guard<std::mutex> lock(f.mutex);
    const auto found = f.by_key.find(key);
    return found == f.by_key.end() ? nullptr : found->second.lock();
}

std::shared_ptr<const std::vector<float>> keep_folded(const std::string& key,
                                                      std::shared_ptr<const std::vector<float>> values) {
    Folded& f = folded();
    std::lock_guard<std::mutex> lock(f.mutex);
    for (auto it = f.by_key.begin(); it != f.by_key.end();) it = it->second.expired() ? f.by_key.erase(it) : std::next(it);
    auto [it, added] = f.by_key.emplace(key, values);
    if (!added) {
        if (auto alive = it->second.lock()) return alive;
        it->second = values;
    }
    return values;
}

std::pair<int64_t, int64_t> folded_usage() {
    Folded& f = folded();
    std::lock_guard<std::mutex> lock(f.mutex);
    return alive_usage(f.by_key);
}

}  // namespace orion::emu
