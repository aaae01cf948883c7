#include "runtime/ane_plan.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "errors.h"

namespace fs = std::filesystem;

namespace orion::runtime::ane_plan {

ModelPlan plan_model(std::string_view mil, const WeightFiles& weights) {
    ModelPlan plan;
    plan.dirs = {"", kWeightsDir};
    plan.files.push_back({kMilFile, mil});
    static const std::set<std::string> reserved = {kMilFile, kCompiledFile, kPatchDataFile, kWeightsDir};
    std::set<std::string> dirs_used;
    for (const auto& [key, bytes] : weights) {  // std::map: key order, keys unique
        const std::string rel = weight_file_relpath(key);
        if (reserved.count(rel))
            throw ConstraintError(constraints::WEIGHT_PATHS, "weight path '" + key + "' would overwrite the model file '" +
                                                                 rel + "': put weights under @model_path/weights/");
        for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1)) {
            const std::string parent = rel.substr(0, slash);
            if (parent != kWeightsDir && !dirs_used.count(parent)) {
                dirs_used.insert(parent);
                plan.dirs.push_back(parent);
            }
        }
        plan.files.push_back({rel, bytes});
        plan.weights.push_back({key, bytes, 0});
    }
    for (const auto& f : plan.files)
        if (dirs_used.count(f.relpath))
            throw ConstraintError(constraints::WEIGHT_PATHS,
                                  "weight path '@model_path/" + f.relpath + "' is both a file and a directory");
    return plan;
}

std::string model_dir_path(const std::string& temp_root, const std::string& hex) {
    if (hex.empty() || hex == "." || hex == ".." || hex.find('/') != std::string::npos || hex.find('\0') != std::string::npos)
        throw CompileError("the framework gave the model identifier '" + hex + "', which is not a directory name");
    if (temp_root.empty()) throw CompileError("no temporary directory (NSTemporaryDirectory() is empty)");
    return (fs::path(temp_root) / hex).string();
}

namespace {
void write_file(const fs::path& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw CompileError("cannot write '" + path.string() + "' (ANE-19: the model directory must be complete before compile)");
}
}  // namespace

void write_model_dir(const std::string& dir, const ModelPlan& plan) {
    std::error_code ec;
    for (const auto& d : plan.dirs) {
        fs::create_directories(fs::path(dir) / d, ec);
        if (ec) throw CompileError("cannot create '" + (fs::path(dir) / d).string() + "': " + ec.message());
    }
    for (const auto& f : plan.files) write_file(fs::path(dir) / f.relpath, f.bytes);
}

std::string patch_data(const WeightFiles& weights) {
    std::string data;
    for (const auto& [key, bytes] : weights) data.append(bytes.data(), bytes.size());
    return data;
}

void check_patch(const WeightFiles& weights, bool unverified) {
    if (weights.size() <= 1 || unverified) return;
    throw CompileError("with_weights on the ane backend: this program has " + std::to_string(weights.size()) +
                       " weight files, and the weight patch is verified on hardware only for one (docs/hardware.md "
                       "§6). Fix: put the program's weights in one BLOBFILE (orion.blobfile.write_many), compile "
                       "again instead, or run `python -m orion doctor --probe` and, when weight_patch_multi_file "
                       "works on this machine, pass unverified_patch=True");
}

CompileStep compile_step(bool has_donor, bool compiled_model_exists) {
    if (has_donor) return CompileStep::patch;
    return compiled_model_exists ? CompileStep::reuse : CompileStep::compile;
}

std::string objc_exception_text(const char* name, const char* reason) {
    if (!name && !reason) return "raised an Objective-C exception that is not an NSException";
    return std::string("raised ") + (name ? name : "NSException") + ": " + (reason ? reason : "(no reason given)");
}

void write_patch_files(const std::string& donor_dir, const std::string& dir, const WeightFiles& weights) {
    const fs::path donor = fs::path(donor_dir) / kCompiledFile, target = fs::path(dir) / kCompiledFile;
    std::error_code ec;
    if (!fs::is_regular_file(donor, ec))
        throw CompileError("cannot update weights without compiling: the donor program has no compiled '" +
                           donor.string() + "' (was it unloaded?)");
    if (fs::absolute(donor) != fs::absolute(target)) {
        fs::copy_file(donor, target, fs::copy_options::overwrite_existing, ec);
        if (ec) throw CompileError("cannot copy '" + donor.string() + "' to '" + target.string() + "': " + ec.message());
    }
    write_file(fs::path(dir) / kPatchDataFile, patch_data(weights));
}

void remove_model_dir(const std::string& dir) noexcept {
    if (dir.empty()) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
}

std::shared_ptr<DirLease> lease_model_dir(const std::string& dir, bool* fresh) {
    static std::mutex mutex;
    static std::map<std::string, std::weak_ptr<DirLease>> leases;
    std::lock_guard<std::mutex> lock(mutex);
    if (auto live = leases[dir].lock()) {
        if (fresh) *fresh = false;
        return live;
    }
    auto lease = std::make_shared<DirLease>(dir);
    leases[dir] = lease;
    if (fresh) *fresh = true;
    return lease;
}

LoadOutcome load_with_retry(const std::function<Attempt()>& load, std::chrono::milliseconds delay) {
    Attempt first = load();
    if (first.ok) return {true, 1, ""};
    std::this_thread::sleep_for(delay);
    Attempt second = load();
    if (second.ok) return {true, 2, ""};
    return {false, 2, second.error.empty() ? first.error : second.error};
}

std::string framework_error(const std::string& step, const std::string& nserror_text) {
    if (!nserror_text.empty()) return step + " failed: " + nserror_text;
    return step + " failed without an NSError";
}

}  // namespace orion::runtime::ane_plan

namespace orion::runtime::ane_plan {

SurfaceProperties surface_properties(size_t bytes) {
    if (bytes == 0) throw EvaluateError("a surface needs at least one byte");
    return {bytes, 1, 1, bytes, bytes, 0};
}

}  // namespace orion::runtime::ane_plan
