// GradientStorage: where a rank's reduced gradient slices go when they do not stay in memory.
// Under optimizer offload to NVMe the engine streams them to the swap files as backward produces
// them (src/engine/gradient_swap.h), so that no buffer of the optimizer domain's size is held:
// ParameterCoordinator hands each reduced slice to the storage instead of writing it into a
// partition buffer. Stages 2-3 only (the gradients are partitioned as they arrive).
#pragma once

#include <cstddef>

#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::zero {

class GradientStorage {
public:
    virtual ~GradientStorage() = default;
    // Parameter `index`'s reduced slice: `numel` values of the coordinator's dtype in device
    // memory at `slice`, produced by work enqueued on `stream`. `first`: the window's first
    // gradient of the parameter (it replaces what is stored); otherwise it is added, rounded to
    // the dtype as the coordinator would. The storage is done reading `slice` when this returns.
    virtual Status store(std::size_t index, const void* slice, std::size_t numel, bool first,
                         StreamId stream) = 0;
    // The accumulation window is complete: parameters without a gradient in it have zero
    // gradient. Every store has finished when this returns.
    virtual Status end_window(StreamId stream) = 0;
};

}  // namespace zinf::zero
