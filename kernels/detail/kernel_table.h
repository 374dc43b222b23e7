// Private: the per-ISA table of chunk functions that kernels/optimizer.cc dispatches through.
// Each table is defined in its own translation unit (optimizer_{scalar,avx2,avx512}.cc), built
// with that ISA's compiler flags. This header holds only plain data and declarations, so that
// including it in an AVX-512 unit shares no inline code with units built for other CPUs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/step_args.h"

namespace zinf::kernels::detail {

// The optimizer kinds, in the order of the table's first index.
inline constexpr int kKindAdam = 0;
inline constexpr int kKindAdamW = 1;
inline constexpr int kKindAdagrad = 2;
inline constexpr int kKindLion = 3;
inline constexpr int kKindCount = 4;
// The copy dtypes, in the order of the table's last index: none, bf16, fp16.
inline constexpr int kCopyCount = 3;
// The table's second index: 0 plain, 1 AMSGrad (set for Adam and AdamW only; null otherwise).
inline constexpr int kAmsgradCount = 2;

// Returns the sum of squares of grads[begin, end) in double, in the order documented in
// kernels/README.md: element i goes to lane i % sum_lanes of the chunk (counted from begin),
// each lane sums in index order, and the lanes are then added in lane order.
using SumSquaresChunkFn = double (*)(const void* grads, std::size_t begin,
                                     std::size_t end) noexcept;
using CastFromFp32Fn = void (*)(const float* src, std::uint16_t* dst, std::size_t numel) noexcept;
using CastToFp32Fn = void (*)(const std::uint16_t* src, float* dst, std::size_t numel) noexcept;

struct KernelTable {
    // [kind][amsgrad][grad DType][copy: none, bf16, fp16]
    StepChunkFn step[kKindCount][kAmsgradCount][3][kCopyCount];
    SumSquaresChunkFn sum_squares[3];  // [grad DType]
    CastFromFp32Fn from_fp32[2];       // [bf16, fp16]
    CastToFp32Fn to_fp32[2];           // [bf16, fp16]
    int sum_lanes;
};

// Defined in the per-ISA units. Call the AVX ones only once the CPU is known to support them.
const KernelTable& scalar_kernel_table() noexcept;
const KernelTable& avx2_kernel_table() noexcept;
const KernelTable& avx512_kernel_table() noexcept;

}  // namespace zinf::kernels::detail
