// Private to kernels/cuda: the launch of the compressed-state step kernels
// (optimizer_states.cu) with the operands the host wrapper (optimizer_states.cc) checked and
// derived, in the CPU chunk functions' own StateStepArgs.
#pragma once

#include <cstddef>

#include "kernels/cuda/stream.h"
#include "kernels/step_args.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::kernels::cuda::detail {

struct StateLaunch {
    // Device pointers, the step's constants, the kept moments, their unsigned mask, the first
    // index and the rounding key and streams, as the CPU step fills them.
    kernels::detail::StateStepArgs args;
    std::size_t numel;  // > 0
    int state;          // kernels::detail::kStateBf16 or kStateInt8
    int kind;      // kernels::detail::kKindAdam .. kKindLion, after Adam without decay -> AdamW
    bool amsgrad;  // Adam and AdamW only
    DType grad_dtype;
    int copy_index;  // 0 none, 1 bf16, 2 fp16
};

Status launch_state_step(const StateLaunch& launch, Stream stream);

}  // namespace zinf::kernels::cuda::detail
