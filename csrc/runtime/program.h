// A compiled and loaded program, whatever backend runs it, and the binding rules both backends
// share: which surface goes to which MIL parameter, and the size rules the ANE imposes on them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mil/program.h"
#include "runtime/surface.h"

namespace orion::runtime {

struct TensorSpec {
    std::string name;
    mil::Type type;
};

// Surfaces named by the MIL parameter / returned variable they bind to.
using Bindings = std::vector<std::pair<std::string, Surface*>>;

// Per input name, how many leading lanes (last-axis entries) hold data the outputs depend on. A
// performance hint: the emulator computes only those lanes, the ANE ignores it. Lanes past the
// hint in the outputs are undefined.
using LiveLanes = std::map<std::string, int64_t>;

// Maps each BLOBFILE path of the MIL (e.g. "@model_path/weights/w.bin") to the whole file.
using WeightFiles = std::map<std::string, std::string_view>;

enum class Profile {
    hardware,    // every known ANE rule enforced (the default)
    permissive,  // op and form bans lifted, for experiments and the disputed forms
};
Profile profile_from_name(const std::string& name);

// What a compile is asked for, besides the text and its weights.
struct CompileOptions {
    Profile profile = Profile::hardware;
    // Disputed ops (mil/op_table.h) a probe report proved on this machine; refused otherwise
    // under the hardware profile (ANE-35).
    std::set<std::string> relaxed_ops;
};

// The backend interface is the protected part: a backend implements run(), reload() and release();
// the public calls run the checks every backend shares first (loaded, bindings, live lanes, locks,
// weight keys), under one lock per program, so no backend can skip them.
class LoadedProgram {
public:
    virtual ~LoadedProgram() = default;
    // Inputs and outputs in binding order: alphabetical by name (FACTS section 3).
    const std::vector<TensorSpec>& inputs() const { return inputs_; }
    const std::vector<TensorSpec>& outputs() const { return outputs_; }
    // Runs the program once, synchronously. `inputs`/`outputs` must be in binding order.
    void evaluate(const Bindings& inputs, const Bindings& outputs, const LiveLanes& live = {});
    // Releases the program on its device (always, ANE-33); later evaluates raise EvaluateError.
    void unload();
    bool loaded() const { return loaded_; }
    // A program of the same MIL with new weight files, without compiling (no compile is counted):
    // the emulator re-bakes, the ANE loads through the patch path (FACTS section 6). Every BLOBFILE
    // path of the MIL must be given again. This program stays loaded.
    std::unique_ptr<LoadedProgram> with_weights(const WeightFiles& weights);
    virtual const char* backend() const = 0;

    // The smallest surface evaluate accepts: the conservative 49,152 bytes (ANE-12) unless a probe
    // report proved a smaller size works on this machine (orion.probes).
    size_t min_surface_bytes() const { return min_surface_bytes_; }
    void set_min_surface_bytes(size_t bytes) { min_surface_bytes_ = bytes; }

protected:
    // Called with the program's lock held, after the shared checks passed.
    virtual void run(const Bindings& inputs, const Bindings& outputs, const LiveLanes& live) = 0;
    virtual std::unique_ptr<LoadedProgram> reload(const WeightFiles& weights) = 0;
    virtual void release() = 0;  // frees the device side; the program is marked unloaded even if it throws

    std::vector<TensorSpec> inputs_, outputs_;
    size_t min_surface_bytes_ = limits::MIN_SURFACE_BYTES;
    bool loaded_ = true;  // set by the backend once its program is loaded

private:
    std::mutex mutex_;
};

// Binding order of a function's I/O: parameters and returned names sorted by name.
std::vector<TensorSpec> sorted_inputs(const mil::Function& fn);
std::vector<TensorSpec> sorted_outputs(const mil::Function& fn);

// Checks surfaces against the rules of FACTS section 3 before an evaluate: names in binding
// order (ANE-20), each surface large enough for its tensor and >= 49,152 bytes (ANE-12), one size
// for all inputs and one for all outputs (ANE-13), no surface bound twice (ANE-15).
// Checks a live-lanes hint: every name an input, every count in 1..the input's last dimension.
void check_live_lanes(const std::vector<TensorSpec>& inputs, const LiveLanes& live);

void check_bindings(const std::vector<TensorSpec>& inputs, const Bindings& in_surfaces,
                    const std::vector<TensorSpec>& outputs, const Bindings& out_surfaces,
                    size_t min_surface_bytes = limits::MIN_SURFACE_BYTES);

// Harness builds only (ORION_ANE_FAULT_INJECTION): whether ORION_ANE_FAULT=name[,name] names this
// fault, so the harness can show the stand-in framework catches what the client failed to check.
// Always false in other builds.
bool fault_injected(const char* name);

// Checks the weight dictionary keys (ANE-34): relative `@model_path/` paths, no '..', and
// returns the file name each key is written to under the model directory.
std::string weight_file_relpath(const std::string& key);

}  // namespace orion::runtime
