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
    struct Input {
        std::string name;
        int slot = -1;
        bool in_place = false;  // fp16 read straight from the surface (Tensor::half): every reader takes fp16
    };
    struct Output {
        int slot = -1;
        int64_t replicated_block = 0;  // the block its store replicates (find_replicated_outputs), or 0: whole
    };

    std::vector<Input> inputs;    // in the program's input order
    std::vector<Output> outputs;  // in the program's output order

    // Whether `slot` is an input read in place from its surface (it has no frame data at all).
    bool reads_in_place(int slot) const;
    // Each input into the frame, its live lanes as `live` hints (every lane when it names none).
    void load(const runtime::Bindings& surfaces, const runtime::LiveLanes& live, Frame& frame) const;
    // Each output's frame tensor into its surface.
    void store(const runtime::Bindings& surfaces, const Frame& frame) const;
};

}  // namespace orion::emu
