// How an emulated program's I/O surfaces meet its frame: each input's frame slot, loaded from its
// surface (converted to fp32; only the live lanes of each row when hinted) or read in place as fp16,
// and each output's slot, stored in the surface's dtype (a replicated output's block once, then copied).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "emulator/ops.h"
#include "runtime/program.h"

namespace orion::emu {

class SurfaceIO {
public:
    // A tensor filled from an input surface before the kernels: a whole input, or a tensor cut from a
    // packed one (runtime::InputPart), read from its place in the surface.
    struct Input {
        int slot = -1;              // its frame tensor
        size_t surface = 0;         // the surface, by binding index
        size_t byte_offset = 0;     // where the tensor starts in it
        bool in_place = false;      // fp16 read straight from the surface (Tensor::half): every reader takes fp16
        std::vector<std::string> hint_names;  // the first of these a live-lanes hint names sets its lanes
    };
    struct Output {
        int slot = -1;
        int64_t replicated_block = 0;  // the block its store replicates (find_replicated_outputs), or 0: whole
    };

    std::vector<Input> inputs;    // the tensors loaded, in load order
    std::vector<Output> outputs;  // in the program's output order

    // Whether `slot` is an input read in place from its surface (it has no frame data at all).
    bool reads_in_place(int slot) const;
    // Each input tensor into the frame, its live lanes as `live` hints (every lane when none names it).
    void load(const runtime::Bindings& surfaces, const runtime::LiveLanes& live, Frame& frame) const;
    // Each output's frame tensor into its surface.
    void store(const runtime::Bindings& surfaces, const Frame& frame) const;
};

}  // namespace orion::emu
