// Every decision of the ane backend that does not need Objective-C, in portable C++ so that it is
// compiled and tested on every platform (csrc/ane_client.mm only carries it out): the model
// directory the framework compiles from (docs/hardware.md §2, step 4), the weight dictionary, the
// weight-patch files (docs/hardware.md §6), the load retry policy (ANE-36) and the QoS value.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/program.h"

namespace orion::runtime::ane_plan {

inline constexpr unsigned kQoS = 21;                  // everyone uses 21; sweeps found no effect
inline constexpr const char* kMilFile = "model.mil";  // the MIL bytes, written before compile
inline constexpr const char* kWeightsDir = "weights";
inline constexpr const char* kCompiledFile = "net.plist";  // written by the framework's compile
inline constexpr const char* kPatchDataFile = "data";      // new weights for a load without compile
inline constexpr std::chrono::milliseconds kLoadRetryDelay{100};

struct File {
    std::string relpath;  // relative to the model directory
    std::string_view bytes;
};

// One entry of the weight dictionary: @{key: @{@"offset": @(offset), @"data": <whole file>}}.
struct WeightEntry {
    std::string key;  // exactly the BLOBFILE path of the MIL, e.g. "@model_path/weights/w.bin"
    std::string_view data;
    uint64_t offset = 0;  // the dictionary offset is 0; the MIL offset (64) points at the chunk
};

struct ModelPlan {
    std::vector<File> files;            // model.mil first, then each weight file in key order
    std::vector<WeightEntry> weights;   // key order; empty means @{} (never nil, ANE-18)
    std::vector<std::string> dirs;      // directories to create first: "" (the root), "weights"
};

// Validates the weight keys (ANE-34: @model_path/ relative, no '..', not a reserved file name)
// and lays out the model directory. `mil` and the weight buffers must outlive the plan.
ModelPlan plan_model(std::string_view mil, const WeightFiles& weights);

// NSTemporaryDirectory()/<hex>: refuses identifiers that are not a plain file name.
std::string model_dir_path(const std::string& temp_root, const std::string& hex_identifier);

// Creates the directories and writes every file of the plan (ANE-19). Throws CompileError.
void write_model_dir(const std::string& dir, const ModelPlan& plan);

// docs/hardware.md §6: the file `data` of a patched program holds the new BLOBFILE bytes. With several
// weight files they are concatenated in key order (unverified on hardware: see check_patch).
std::string patch_data(const WeightFiles& weights);

// The weight patch on the ane backend is verified publicly only for a program with one weight file
// ([O]: `data` is that file). Throws CompileError for several files unless `unverified` (given only
// when `doctor --probe` showed weight_patch_multi_file working on this machine).
void check_patch(const WeightFiles& weights, bool unverified);

// What creating a program does before loading: patch a donor's compiled program (with_weights),
// reuse the compiled model the framework already holds (compiledModelExists: not counted against
// the budget), or compile (counted).
enum class CompileStep { patch, reuse, compile };
CompileStep compile_step(bool has_donor, bool compiled_model_exists);

// Text for an Objective-C exception raised by a framework call (name and reason may be null).
std::string objc_exception_text(const char* name, const char* reason);

// The patch path: copies the donor's compiled net.plist into `dir` and writes `data`. Throws
// CompileError when the donor has no net.plist (it was never compiled or was cleaned up).
void write_patch_files(const std::string& donor_dir, const std::string& dir, const WeightFiles& weights);

// Removes a model directory and everything in it; never throws.
void remove_model_dir(const std::string& dir) noexcept;

// Programs with the same MIL and weights get the same identifier, hence the same directory: they
// share it through a lease, and the directory is removed when the last lease is released.
class DirLease {
public:
    explicit DirLease(std::string dir) : dir_(std::move(dir)) {}
    ~DirLease() { remove_model_dir(dir_); }
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
};
// The live lease for `dir`, or a new one (`fresh` tells which).
std::shared_ptr<DirLease> lease_model_dir(const std::string& dir, bool* fresh);

// ANE-36: one load attempt, then (on failure) one more after `delay`. Returns whether it loaded,
// the number of attempts made and the last error text.
struct Attempt {
    bool ok;
    std::string error;
};
struct LoadOutcome {
    bool ok;
    int attempts;
    std::string error;
};
LoadOutcome load_with_retry(const std::function<Attempt()>& load,
                            std::chrono::milliseconds delay = kLoadRetryDelay);

// Error text for a failed framework call: "<step> failed: <NSError text>" or, without an
// NSError, what usually causes that on hardware.
std::string framework_error(const std::string& step, const std::string& nserror_text);

}  // namespace orion::runtime::ane_plan

namespace orion::runtime::ane_plan {

// docs/hardware.md §3: an I/O surface is a flat byte buffer of `bytes` bytes.
struct SurfaceProperties {
    size_t width, height, bytes_per_element, bytes_per_row, alloc_size;
    uint32_t pixel_format;
};
SurfaceProperties surface_properties(size_t bytes);

}  // namespace orion::runtime::ane_plan
