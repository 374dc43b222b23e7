// Private: the per-ISA table of the compressed-state step functions (kernels/detail/state_body.h),
// defined in optimizer_states_{scalar,avx2,avx512}.cc. Plain data and declarations only, as
// kernel_table.h.
#pragma once

#include "kernels/detail/kernel_table.h"
#include "kernels/step_args.h"
#include "src/base/state_dtype.h"

namespace zinf::kernels::detail {

// The table's first index: the compressed dtypes (StateDType::kBf16 and kInt8, less one).
inline constexpr int kStateBf16 = 0;
inline constexpr int kStateInt8 = 1;
inline constexpr int kCompressedStateCount = 2;

struct StateKernelTable {
    // [state dtype][kind][amsgrad][grad DType][copy: none, bf16, fp16]
    StateStepChunkFn step[kCompressedStateCount][kKindCount][kAmsgradCount][3][kCopyCount];
};

// Defined in the per-ISA units. Call the AVX ones only once the CPU is known to support them.
const StateKernelTable& scalar_state_kernel_table() noexcept;
const StateKernelTable& avx2_state_kernel_table() noexcept;
const StateKernelTable& avx512_state_kernel_table() noexcept;

}  // namespace zinf::kernels::detail
