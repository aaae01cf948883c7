// The backend registry: which backends this build has, which of them can run here, and which one a
// process uses (the ANE where its framework loads, else the emulator, unless ORION_BACKEND says).
// Portable: the Objective-C client only registers itself and answers "did the framework load".
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/program.h"
#include "runtime/surface.h"

namespace orion::runtime {

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
