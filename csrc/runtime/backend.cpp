#include "runtime/backend.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "errors.h"

namespace orion::runtime {

namespace {
std::mutex g_mutex;
std::vector<Backend>& registry() {
    static std::vector<Backend> backends;
    return backends;
}

const BackendStatus* find_status(const std::vector<BackendStatus>& statuses, const std::string& name) {
    for (const auto& s : statuses)
        if (s.name == name) return &s;
    return nullptr;
}

std::string host_platform() {
#if defined(__APPLE__)
    const char* os = "macOS";
#elif defined(__linux__)
    const char* os = "Linux";
#else
    const char* os = "this OS";
#endif
#if defined(__aarch64__) || defined(__arm64__)
    return std::string(os) + " arm64";
#elif defined(__x86_64__)
    return std::string(os) + " x86_64";
#else
    return os;
#endif
}
}  // namespace

void LoadedProgram::evaluate(const Bindings& inputs, const Bindings& outputs, const LiveLanes& live) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loaded_) throw EvaluateError("the program was unloaded; compile it again");
    check_live_lanes(inputs_, parts_, live);
    if (!fault_injected("skip_binding_checks")) check_bindings(inputs_, inputs, outputs_, outputs, min_surface_bytes_);
    for (const auto* side : {&inputs, &outputs})
        for (const auto& [name, surface] : *side)
            if (surface && surface->locked())
                throw EvaluateError("'" + name + "' is locked: unlock surfaces before evaluate "
                                    "(never hold a lock across an evaluate)");
    run(inputs, outputs, live);
}

void LoadedProgram::unload() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loaded_) return;
    struct MarkUnloaded {
        bool& loaded;
        ~MarkUnloaded() { loaded = false; }
    } mark{loaded_};
    release();
}

std::unique_ptr<LoadedProgram> LoadedProgram::with_weights(const WeightFiles& weights) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loaded_) throw CompileError("with_weights: the program was unloaded; compile it again");
    for (const auto& [key, bytes] : weights) weight_file_relpath(key);
    auto program = reload(weights);
    program->set_min_surface_bytes(min_surface_bytes_);
    return program;
}

void register_backend(const Backend& backend) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto& r = registry();
    auto it = std::find_if(r.begin(), r.end(), [&](const Backend& b) { return b.name == backend.name; });
    if (it != r.end())
        *it = backend;
    else
        r.push_back(backend);
}

std::vector<Backend> registered_backends() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return registry();
}

const Backend& find_backend(const std::string& name) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& b : registry())
        if (b.name == name) return b;
    throw CompileError("no backend named '" + name + "' in this build");
}

Selection select_backend(const std::string& requested, const std::vector<BackendStatus>& statuses,
                         const std::string& platform) {
    const BackendStatus* ane = find_status(statuses, "ane");
    const std::string ane_why =
        ane ? "the ANE framework did not load: " + ane->detail
            : "this build has no ANE client (" + platform + "; the ane backend needs macOS on Apple Silicon)";
    if (requested == "emulator") return {"emulator", "ORION_BACKEND=emulator", ""};
    if (requested == "ane") {
        if (ane && ane->available) return {"ane", "ORION_BACKEND=ane; " + ane->detail, ""};
        throw CompileError("ORION_BACKEND=ane, but " + ane_why + ". Unset ORION_BACKEND to use the emulator.");
    }
    if (!requested.empty())
        throw CompileError("ORION_BACKEND='" + requested + "' is not a backend; use 'ane' or 'emulator', or unset it");
    if (ane && ane->available) return {"ane", ane->detail, ""};
    Selection s{"emulator", "software ANE emulator: " + ane_why, ""};
    if (ane) s.warning = "orion: ANE unavailable (" + ane->detail + "); using the emulator";
    return s;
}

Selection current_selection() {
    std::vector<BackendStatus> statuses;
    for (const auto& b : registered_backends()) statuses.push_back(b.probe());
    const char* env = std::getenv("ORION_BACKEND");
    std::string requested = env ? env : "";
    requested.erase(0, requested.find_first_not_of(" \t"));
    requested.erase(requested.find_last_not_of(" \t") + 1);
    std::transform(requested.begin(), requested.end(), requested.begin(), [](unsigned char c) { return std::tolower(c); });
    return select_backend(requested, statuses, host_platform());
}

const SurfaceAllocator& surface_allocator(const std::string& backend) {
    const SurfaceAllocator* alloc = find_backend(backend).surfaces();
    return alloc ? *alloc : host_allocator();
}

}  // namespace orion::runtime
