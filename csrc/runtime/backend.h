// The C++ backend interface, on one screen: a backend is a Backend entry (compile, probe, surface
// allocator) whose programs derive from LoadedProgram; and the registry: which backends this build
// has, which of them can run here, and which one a process uses (the ANE where its framework loads,
// else the emulator, unless ORION_BACKEND says). Each backend registers itself from its own file
// (emulator/emulator.cpp, ane_client.mm).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/program.h"
#include "runtime/surface.h"

namespace orion::runtime {

// The backend interface is the protected part: a backend implements run(), reload() and release();
// the public calls run the checks every backend shares first (loaded, bindings, live lanes, locks,
// weight keys), under one lock per program, so no backend can skip them.
class LoadedProgram {
public:
    virtual ~LoadedProgram() = default;
    // Inputs and outputs in binding order: alphabetical by name (docs/hardware.md §3).
    const std::vector<TensorSpec>& inputs() const { return inputs_; }
    const std::vector<TensorSpec>& outputs() const { return outputs_; }
    // The tensors the program cuts from its input surfaces (InputPart): a live-lanes hint may name them.
    const std::vector<InputPart>& input_parts() const { return parts_; }
    // Runs the program once, synchronously. `inputs`/`outputs` must be in binding order.
    void evaluate(const Bindings& inputs, const Bindings& outputs, const LiveLanes& live = {});
    // Releases the program on its device (always, ANE-33); later evaluates raise EvaluateError.
    void unload();
    bool loaded() const { return loaded_; }
    // A program of the same MIL with new weight files, without compiling (no compile is counted):
    // the emulator re-bakes, the ANE loads through the patch path (docs/hardware.md §6). Every BLOBFILE
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
    std::vector<InputPart> parts_;
    size_t min_surface_bytes_ = limits::MIN_SURFACE_BYTES;
    bool loaded_ = true;  // set by the backend once its program is loaded

private:
    std::mutex mutex_;
};

struct BackendStatus {
    std::string name;
    bool available = false;
    std::string detail;  // why (not) available, e.g. the dlopen error
};

struct Backend {
    std::string name;
    // Compiles and loads; counts one compile toward the budget once the program reaches the device
    // compiler (a program the front end refuses costs nothing).
    std::unique_ptr<LoadedProgram> (*compile)(std::string_view mil, const WeightFiles& weights,
                                              const CompileOptions& options);
    BackendStatus (*probe)();                   // cheap after the first call
    const SurfaceAllocator* (*surfaces)();       // allocator its programs need; nullptr = any
};

// Registers a backend (later registrations of the same name replace earlier ones). Each backend
// registers itself from its own file, at static initialisation.
void register_backend(const Backend& backend);
std::vector<Backend> registered_backends();
const Backend& find_backend(const std::string& name);  // throws CompileError for an unknown name

struct Selection {
    std::string name;     // the backend to use
    std::string reason;   // one line: why this one
    std::string warning;  // non-empty when the preferred backend could not be used (e.g. Intel Mac)
};

// Pure selection rule (tested with made-up statuses): `requested` is ORION_BACKEND ("" = automatic).
// Automatic prefers "ane" when it is built and available, else "emulator". An explicit request for
// an unavailable or unknown backend throws CompileError naming the reason.
Selection select_backend(const std::string& requested, const std::vector<BackendStatus>& statuses,
                         const std::string& platform);

// The selection for this process from ORION_BACKEND and the registered backends' probes.
Selection current_selection();

// The allocator surfaces for `backend`'s programs come from (host memory when it takes any).
const SurfaceAllocator& surface_allocator(const std::string& backend);

}  // namespace orion::runtime
