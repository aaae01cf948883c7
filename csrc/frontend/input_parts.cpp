#include "frontend/input_parts.h"

#include <algorithm>
#include <set>

namespace orion::frontend {

namespace {

// The element offset of a stride-1 box of `shape` when its elements are one contiguous run: every
// axis before the first with more than one element is a single index, every axis after it is whole.
bool contiguous_box(const Shape& shape, const Slice& s, int64_t* offset) {
    if (s.begin.size() != shape.size() || s.extent.size() != shape.size()) return false;
    if (std::any_of(s.stride.begin(), s.stride.end(), [](int64_t k) { return k != 1; })) return false;
    size_t first = 0;
    while (first < shape.size() && s.extent[first] == 1) ++first;
    for (size_t d = first + 1; d < shape.size(); ++d)
        if (s.begin[d] != 0 || s.extent[d] != shape[d]) return false;
    if (std::any_of(s.extent.begin(), s.extent.end(), [](int64_t e) { return e < 1; })) return false;
    int64_t at = 0, stride = 1;
    for (size_t d = shape.size(); d-- > 0;) at += s.begin[d] * stride, stride *= shape[d];
    *offset = at;
    return true;
}

}  // namespace

InputCuts find_input_cuts(const mil::Function& fn, const std::vector<runtime::TensorSpec>& inputs,
                          const std::vector<TypedOp>& typed) {
    InputCuts cuts;
    std::map<std::string, runtime::InputPart> from;  // inputs and ranges by name
    for (size_t i = 0; i < inputs.size(); ++i)
        from[inputs[i].name] = {inputs[i].name, inputs[i].type, i, 0, {inputs[i].name}};
    std::set<std::string> cut_sources;  // per cut op's output: made from a range (not a reader of it)
    for (size_t i = 0; i < fn.body.size() && i < typed.size(); ++i) {
        const mil::Operation& op = fn.body[i];
        if (op.op != "reshape" && op.op != "slice_by_size") continue;
        const mil::Argument* x = op.arg("x");
        if (!x || x->kind != mil::Argument::Kind::ref) continue;
        const auto source = from.find(x->refs[0]);
        if (source == from.end() || source->second.type.dtype != op.type.dtype) continue;
        int64_t offset = 0;
        if (op.op == "slice_by_size") {
            const auto* box = std::get_if<Slice>(&typed[i].attrs);
            if (!box || !contiguous_box(source->second.type.shape, *box, &offset)) continue;
        }
        const runtime::InputPart& src = source->second;
        runtime::InputPart part{op.output, op.type, src.input, src.offset + offset, {op.output}};
        const int64_t width = op.type.shape.empty() ? 1 : op.type.shape.back();
        const int64_t source_width = src.type.shape.empty() ? 1 : src.type.shape.back();
        if (width == source_width && offset % width == 0)  // whole rows of the source: its hint holds here too
            part.hint_names.insert(part.hint_names.end(), src.hint_names.begin(), src.hint_names.end());
        from[op.output] = part;
        cuts.ranges[op.output] = part;
        cut_sources.insert(op.output);
    }
    std::set<std::string> used;  // ranges something other than a cut of them reads
    for (const auto& op : fn.body)
        for (const auto& a : op.args)
            for (const auto& ref : a.refs) {
                if (!cuts.ranges.count(ref)) continue;
                const bool is_cut = cut_sources.count(op.output) && a.name == "x";
                if (!is_cut) used.insert(ref);
            }
    for (const auto& name : fn.outputs)
        if (cuts.ranges.count(name)) used.insert(name);
    for (const auto& op : fn.body)
        if (used.count(op.output)) cuts.parts.push_back(cuts.ranges.at(op.output));
    return cuts;
}

}  // namespace orion::frontend
