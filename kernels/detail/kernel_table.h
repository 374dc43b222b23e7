// Private: the per-ISA table of chunk functions that kernels/optimizer.cc dispatches through.
// Each table is defined in its own translation unit (optimizer_{scalar,avx2,avx512}.cc), built
// with that ISA's compiler flags. This header holds only plain data and declarations, so that
// including it in an AVX-512 unit shares no inline code with units built for other CPUs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::kernels::detail {

// The per-step constants, already in fp32, computed once per step in double precision by
// kernels/optimizer.cc (bias corrections use std::pow on the 64-bit step count).
struct StepConstants {
    float grad_scale;  // gradient multiplier: unscale and clip in the same pass
    float beta1;
    float one_minus_beta1;
    float beta2;
    float one_minus_beta2;
    float eps;
    float step_size;                  // negative: -lr / (1 - beta1^t) for Adam; -lr otherwise
    float inv_sqrt_bias_correction2;  // 1 / sqrt(1 - beta2^t); 1 without bias correction
    float sqrt_bias_correction2;      // sqrt(1 - beta2^t): torch divides by it
    std::uint32_t torch_rounding;     // 1: Adam/AdamW in torch's operation order
    float l2_weight_decay;            // added to the gradient as wd * p (Adam, Adagrad)
    float decay_factor;               // p *= 1 - lr * wd before the update (AdamW, Lion)
};

// The operands of one step. Spans were checked by the caller; chunk functions index them with
// [begin, end). Pointers the optimizer does not use are null (exp_avg_sq for Lion,
// max_exp_avg_sq without AMSGrad, ...).
struct StepArgs {
    float* params;
    float* exp_avg;
    float* exp_avg_sq;
    float* max_exp_avg_sq;  // AMSGrad (Adam, AdamW): the running maximum of exp_avg_sq
    const void* grads;  // float or uint16_t (bf16, fp16): the table entry fixes which
    void* param_copy;   // uint16_t (bf16, fp16) or null
    StepConstants c;
};

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

// Updates elements [begin, end). Per-element results do not depend on begin or end.
using StepChunkFn = void (*)(const StepArgs& args, std::size_t begin, std::size_t end) noexcept;
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
