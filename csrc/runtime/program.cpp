#include "runtime/program.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "errors.h"

namespace orion::runtime {

Profile profile_from_name(const std::string& name) {
    if (name == "hardware") return Profile::hardware;
    if (name == "permissive") return Profile::permissive;
    throw CompileError("unknown profile '" + name + "': use 'hardware' (default) or 'permissive'");
}

namespace {
// `text` with control characters written as \xNN, for messages.
std::string printable(const std::string& text) {
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned char c : text) {
        if (c >= 0x20 && c != 0x7f) {
            out += static_cast<char>(c);
        } else {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

std::vector<TensorSpec> sorted(std::vector<TensorSpec> specs) {
    std::sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
    return specs;
}

void check_side(const char* side, const std::vector<TensorSpec>& specs, const Bindings& given,
                std::set<const Surface*>& seen, size_t min_bytes) {
    if (given.size() != specs.size()) {
        std::string expected, got;
        for (const auto& s : specs) expected += (expected.empty() ? "'" : ", '") + s.name + "'";
        for (const auto& g : given) got += (got.empty() ? "'" : ", '") + g.first + "'";
        throw EvaluateError(std::string("expected ") + std::to_string(specs.size()) + " " + side + " surfaces (" +
                            expected + "), got " + std::to_string(given.size()) + (got.empty() ? "" : " (" + got + ")") +
                            ": bind one surface per " + side + " name");
    }
    size_t common_size = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
        const std::string& name = given[i].first;  // not a structured binding: lambdas capture it (C++17)
        const auto& surface = given[i].second;
        if (name != specs[i].name) {
            const bool known = std::any_of(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
            if (!known) throw EvaluateError(std::string("no ") + side + " named '" + name + "' in this program");
            throw ConstraintError(constraints::BINDING_ORDER,
                                  std::string(side) + " surface #" + std::to_string(i) + " is bound as '" + name +
                                      "' but binding position " + std::to_string(i) + " belongs to '" + specs[i].name +
                                      "': the ANE binds " + side + "s in alphabetical order of names; sort them");
        }
        if (!surface) throw EvaluateError(std::string(side) + " '" + name + "' has no surface");
        const size_t need = static_cast<size_t>(specs[i].type.byte_size());
        if (surface->size() < need)
            throw EvaluateError(std::string(side) + " '" + name + "' needs " + std::to_string(need) +
                                " bytes for " + specs[i].type.str() + " but its surface has " +
                                std::to_string(surface->size()));
        if (surface->size() < min_bytes)
            throw ConstraintError(constraints::SURFACE_MIN_SIZE,
                                  std::string(side) + " '" + name + "' surface is " + std::to_string(surface->size()) +
                                      " bytes; allocate at least " + std::to_string(min_bytes) +
                                      " (pad the lane dimension)");
        if (i == 0) common_size = surface->size();
        if (surface->size() != common_size)
            throw ConstraintError(constraints::SURFACE_UNIFORM,
                                  std::string(side) + " '" + name + "' surface is " + std::to_string(surface->size()) +
                                      " bytes but '" + given[0].first + "' is " + std::to_string(common_size) +
                                      ": pad every " + side + " surface to the largest");
        if (!seen.insert(surface).second)
            throw ConstraintError(constraints::SURFACE_ALIAS,
                                  std::string(side) + " '" + name + "' reuses a surface already bound in this call");
    }
}
}  // namespace

std::vector<TensorSpec> sorted_inputs(const mil::Function& fn) {
    std::vector<TensorSpec> specs;
    for (const auto& p : fn.inputs) specs.push_back({p.name, p.type});
    return sorted(std::move(specs));
}

std::vector<TensorSpec> sorted_outputs(const mil::Function& fn) {
    std::vector<TensorSpec> specs;
    for (const auto& name : fn.outputs) {
        mil::Type type;
        for (const auto& op : fn.body)
            if (op.output == name) type = op.type;
        specs.push_back({name, type});
    }
    return sorted(std::move(specs));
}

bool fault_injected(const char* name) {
#ifdef ORION_ANE_FAULT_INJECTION
    const char* env = std::getenv("ORION_ANE_FAULT");
    if (!env) return false;
    const std::string list = std::string(",") + env + ",";
    return list.find(std::string(",") + name + ",") != std::string::npos;
#else
    (void)name;
    return false;
#endif
}

void check_live_lanes(const std::vector<TensorSpec>& inputs, const std::vector<InputPart>& parts, const LiveLanes& live) {
    for (const auto& [name, lanes] : live) {
        const mil::Type* type = nullptr;
        for (const auto& s : inputs)
            if (s.name == name) type = &s.type;
        for (const auto& p : parts)
            if (p.name == name) type = &p.type;
        if (!type) throw EvaluateError("live_lanes names '" + name + "', which is not an input (nor a tensor cut from one)");
        const int64_t width = type->shape.empty() ? 1 : type->shape.back();
        if (lanes < 1 || lanes > width)
            throw EvaluateError("live_lanes['" + name + "'] = " + std::to_string(lanes) + ": give 1.." +
                                std::to_string(width) + " (the input's last dimension)");
    }
}

void check_bindings(const std::vector<TensorSpec>& inputs, const Bindings& in_surfaces,
                    const std::vector<TensorSpec>& outputs, const Bindings& out_surfaces,
                    size_t min_surface_bytes) {
    std::set<const Surface*> seen;
    check_side("input", inputs, in_surfaces, seen, min_surface_bytes);
    check_side("output", outputs, out_surfaces, seen, min_surface_bytes);
}

std::string weight_file_relpath(const std::string& key) {
    static const std::string prefix = "@model_path/";
    if (key.compare(0, prefix.size(), prefix) != 0)
        throw ConstraintError(constraints::WEIGHT_PATHS,
                              "weight path '" + key + "' must start with '@model_path/' (e.g. @model_path/weights/w.bin)");
    for (unsigned char c : key)
        if (c < 0x20 || c == 0x7f)
            throw ConstraintError(constraints::WEIGHT_PATHS,
                                  "weight path '" + printable(key) + "' contains a control character (byte " +
                                      std::to_string(c) + "): use printable file names");
    const std::string rel = key.substr(prefix.size());
    if (rel.empty() || rel.front() == '/' || rel.back() == '/')
        throw ConstraintError(constraints::WEIGHT_PATHS, "weight path '" + key + "' must name a file under @model_path/");
    size_t start = 0;
    while (start <= rel.size()) {
        const size_t end = std::min(rel.find('/', start), rel.size());
        const std::string part = rel.substr(start, end - start);
        if (part.empty() || part == "." || part == "..")
            throw ConstraintError(constraints::WEIGHT_PATHS,
                                  "weight path '" + key + "' has an empty, '.' or '..' component");
        start = end + 1;
    }
    return rel;
}

}  // namespace orion::runtime
