// What a compiled program binds and the rules both backends share: which surface goes to which MIL
// parameter, the size rules the ANE imposes on them, and the weight dictionary's keys. The program
// itself (runtime::LoadedProgram) is the backend interface, in runtime/backend.h.
#pragma once

#include <map>
#include <memory>
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

// A tensor a program cuts out of one of its input surfaces by slices and reshapes alone (the I/O
// packing lays several tensors in one surface, ANE-37; the I/O padding puts a small one at the front
// of a larger one): the MIL value `name` of type `type` holds elements [offset, offset + its count)
// of input `input` (an index in binding order), in the input's dtype. A live-lanes hint may name it;
// `hint_names` are the names whose hint sets its lanes: its own, then those of the cuts (and the
// input) it is whole rows of, nearest first.
struct InputPart {
    std::string name;
    mil::Type type;
    size_t input = 0;
    int64_t offset = 0;
    std::vector<std::string> hint_names;
};

// Surfaces named by the MIL parameter / returned variable they bind to.
using Bindings = std::vector<std::pair<std::string, Surface*>>;

// Per input name (or the name of an InputPart), how many leading lanes (last-axis entries) hold data
// the outputs depend on. A performance hint: the emulator computes only those lanes, the ANE ignores
// it. Lanes past the hint in the outputs are undefined.
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
    // Input and output surfaces a program may bind under the hardware profile (ANE-37, disputed): one
    // input (maderix/ANE saw several fail with 0x1d) and six outputs (the most mechramc/Orion ran),
    // unless a probe report proved more on this machine.
    size_t max_inputs = limits::MAX_INPUT_SURFACES;
    size_t max_outputs = limits::MAX_OUTPUT_SURFACES;
    // Per BLOBFILE path, a name that the file's bytes alone determine (the program cache's blob name,
    // its SHA-256): the emulator shares a packed weight of that file by it, without hashing or
    // comparing the weight's bytes. A key must never name different bytes; paths without one are
    // shared by content (hashed, then compared).
    std::map<std::string, std::string> weight_keys;
    // Per keyed weight ("<weight key>@<offset>/<cout>x<cin>", as emulator::kernels::keyed_conv1x1_packed names
    // them), a file of its packed panels the caller checked (the program cache's): the emulator maps it instead
    // of packing the weight. Ignored by backends that do not pack weights.
    std::map<std::string, std::string> packed_weights;
};

// Binding order of a function's I/O: parameters and returned names sorted by name.
std::vector<TensorSpec> sorted_inputs(const mil::Function& fn);
std::vector<TensorSpec> sorted_outputs(const mil::Function& fn);

// Checks surfaces against the rules of docs/hardware.md §3 before an evaluate: names in binding
// order (ANE-20), each surface large enough for its tensor and >= 49,152 bytes (ANE-12), one size
// for all inputs and one for all outputs (ANE-13), no surface bound twice (ANE-15).
// Checks a live-lanes hint: every name an input or an input part, every count in 1..its last dimension.
void check_live_lanes(const std::vector<TensorSpec>& inputs, const std::vector<InputPart>& parts, const LiveLanes& live);

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
