// The operands of one optimizer step as the chunk functions take them: plain data, no inline
// code (the per-ISA units include it under different -m flags). Public because an optimizer
// registered from outside kernels/ (kernels::register_optimizer) writes chunk functions of this
// shape; the built-in ones live in kernels/detail.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf::kernels::detail {

// The most moments a step passes (zinf::kMaxMoments, checked in kernels/optimizer.cc).
inline constexpr int kStepMoments = 3;

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
// [begin, end). Pointers the optimizer does not use are null.
struct StepArgs {
    float* params;
    // The kept moments in the optimizer's order (OptimizerDescriptor::moments; Adam: exp_avg,
    // exp_avg_sq, then max_exp_avg_sq with amsgrad); null past the kept ones.
    float* moments[kStepMoments];
    const void* grads;  // float or uint16_t (bf16, fp16): the table entry fixes which
    void* param_copy;   // uint16_t (bf16, fp16) or null
    StepConstants c;
};

// Updates elements [begin, end). Per-element results do not depend on begin or end.
using StepChunkFn = void (*)(const StepArgs& args, std::size_t begin, std::size_t end) noexcept;

// The operands of a step whose moments are stored compressed (bf16 or int8; kernels/README.md,
// "Compressed optimizer states"). step.moments are unused (null); the chunk functions decode a
// block of 2048 elements into fp32, run the fp32 step on it and encode it back.
struct StateStepArgs {
    StepArgs step;
    // Moment k's stored elements (uint16_t bf16 bits or uint8_t int8 codes), from element 0.
    void* stored[kStepMoments];
    float* scales[kStepMoments];  // int8: one per block, from element 0's block; else null
    int moment_count;             // the kept moments
    std::uint32_t unsigned_mask;  // bit k: moment k is never negative (int8: unsigned code)
    std::uint64_t first_index;    // the global flat index of element 0; a multiple of 2048
    // The stochastic rounding's keys (kernels/state_codec.h's rounding_key) of moment pairs 0
    // (moments 0, 1) and 1 (moment 2) at this step.
    std::uint64_t rounding_keys[2];
};

// Updates elements [begin, end); begin is a multiple of 2048 (a block boundary).
using StateStepChunkFn = void (*)(const StateStepArgs& args, std::size_t begin,
                                  std::size_t end) noexcept;

}  // namespace zinf::kernels::detail
