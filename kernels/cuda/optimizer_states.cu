// The compressed-state optimizer step on the GPU (kernels/cuda/optimizer_states.h): one thread
// block of 256 threads per 2048-element block of the global flat index. Each thread takes two
// groups of four consecutive elements, decodes their moments, runs the fp32 element code of
// kernels/detail/optimizer_body.h's update_lanes with every rounding explicit and fused
// multiply-adds, and writes the parameters and the copy. bf16 rounds each new moment back at once;
// int8 keeps the new moments in registers until the block's largest magnitude (a block reduction of
// |x|'s bits) gives the scale, then encodes them. Both round stochastically with the elements'
// rounding words (state_codec.h's rounding_word, host and device code alike). The codec functions
// below are kernels/state_codec.h's, operation for operation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/half_bits.cuh"
#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/detail/optimizer_states_launch.h"
#include "kernels/detail/kernel_table.h"
#include "kernels/detail/optimizer_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/assert.h"

namespace zinf::kernels::cuda {
namespace {

namespace kd = kernels::detail;

constexpr int kStateThreads = 256;
constexpr std::size_t kBlock = kStateBlockNumel;
constexpr int kGroupNumel = 4;  // consecutive elements per thread and group
constexpr int kGroupsPerThread = static_cast<int>(kBlock) / (kGroupNumel * kStateThreads);
constexpr int kElementsPerThread = kGroupNumel * kGroupsPerThread;
static_assert(kBlock % (kGroupNumel * kStateThreads) == 0);
static_assert(kd::kStepMoments == 3);

// ---- kernels/state_codec.h on the device ----

// code_ratio: f(c), the float with bits (c + K) << 20.
__device__ inline float code_ratio(int c, int code_max) {
    return __uint_as_float(static_cast<std::uint32_t>(c + code_bias(code_max)) << 20);
}

// encode_ratio_stochastic: random16 at bits 4..19 of the ratio's bits, shifted, less K, clamped.
__device__ inline int encode_ratio_stochastic(float r, int code_max, std::uint32_t random16) {
    const int c = static_cast<int>((__float_as_uint(r) + ((random16 & 0xffffu) << 4)) >> 20) -
                  code_bias(code_max);
    return c < 0 ? 0 : (c > code_max ? code_max : c);
}

__device__ inline std::uint8_t encode_int8_stochastic(float x, float inv_scale, bool is_unsigned,
                                                      std::uint32_t random16) {
    const std::uint32_t bits = __float_as_uint(x);
    const float magnitude = __uint_as_float(bits & 0x7fffffffu);
    const int c = encode_ratio_stochastic(
        __fmul_rn(magnitude, inv_scale), is_unsigned ? kUnsignedCodeMax : kSignedCodeMax, random16);
    if (is_unsigned || (bits & 0x80000000u) == 0) return static_cast<std::uint8_t>(c);
    return static_cast<std::uint8_t>(-c);  // two's complement of the negative code
}

__device__ inline float decode_int8(std::uint8_t code, float scale, bool is_unsigned) {
    if (is_unsigned) return code == 0 ? 0.0f : __fmul_rn(scale, code_ratio(code, kUnsignedCodeMax));
    const int q = code < 128 ? static_cast<int>(code) : static_cast<int>(code) - 256;
    if (q == 0) return 0.0f;
    const float magnitude = __fmul_rn(scale, code_ratio(q < 0 ? -q : q, kSignedCodeMax));
    return q < 0 ? -magnitude : magnitude;
}

// int8_inverse_scale: 0 unless the scale is a finite normal number.
__device__ inline float int8_inverse_scale(float scale) {
    return scale >= 0x1p-126f && scale <= 0x1.fffffep+127f ? __fdiv_rn(1.0f, scale) : 0.0f;
}

__device__ inline std::uint16_t float_to_bf16_stochastic(float x, std::uint32_t random16) {
    const std::uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
    return static_cast<std::uint16_t>((bits + (random16 & 0xffffu)) >> 16);
}

// ---- The element update: update_lanes (kernels/detail/optimizer_body.h), one element ----

__device__ inline float load_grad(const float* p, std::size_t i) {
    return p[i];
}
__device__ inline float load_grad(const __nv_bfloat16* p, std::size_t i) {
    return detail::bf16_to_float(p[i]);
}
__device__ inline float load_grad(const __half* p, std::size_t i) {
    return detail::fp16_to_float(p[i]);
}

// V::max of the CPU variants: a when a is NaN, else b unless a > b.
__device__ inline float max_keeping_nan(float a, float b) {
    if (isnan(a)) return a;
    return a > b ? a : b;
}

// V::sign: -1, 0 or +1; a NaN stays NaN.
__device__ inline float sign_keeping_nan(float x) {
    if (x > 0.0f) return 1.0f;
    if (x < 0.0f) return -1.0f;
    if (x == 0.0f) return 0.0f;
    return x;
}

// The parameter p and the kept moments (in MomentSlots' order) in place, with update_lanes'
// operations in its order, each rounding explicit: no contraction is left to the compiler.
template <int kKind, bool kAmsgrad>
__device__ inline void update_element(const kd::StepConstants& k, float grad, float& p_io,
                                      float (&moment)[kd::kStepMoments]) {
    static_assert(!kAmsgrad || kKind == kd::kKindAdam || kKind == kd::kKindAdamW);
    using Slots = kd::MomentSlots<kKind>;
    float g = __fmul_rn(grad, k.grad_scale);
    float p = p_io;
    if constexpr (kKind == kd::kKindAdam || kKind == kd::kKindAdamW) {
        if constexpr (kKind == kd::kKindAdam) g = __fmaf_rn(k.l2_weight_decay, p, g);
        float m = moment[Slots::kExpAvg];
        float v = moment[Slots::kExpAvgSq];
        if (k.torch_rounding != 0) {
            m = __fmaf_rn(g, k.one_minus_beta1, __fmul_rn(m, k.beta1));
            v = __fmaf_rn(__fmul_rn(k.one_minus_beta2, g), g, __fmul_rn(v, k.beta2));
        } else {
            m = __fmaf_rn(k.beta1, m, __fmul_rn(k.one_minus_beta1, g));
            v = __fmaf_rn(k.beta2, v, __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
        }
        float second_moment = v;
        if constexpr (kAmsgrad) {
            second_moment = max_keeping_nan(moment[Slots::kMaxExpAvgSq], v);
            moment[Slots::kMaxExpAvgSq] = second_moment;
        }
        if (k.torch_rounding != 0) {
            const float denom =
                __fadd_rn(__fdiv_rn(__fsqrt_rn(second_moment), k.sqrt_bias_correction2), k.eps);
            if constexpr (kKind == kd::kKindAdamW) p = __fmul_rn(p, k.decay_factor);
            p = __fadd_rn(p, __fdiv_rn(__fmul_rn(k.step_size, m), denom));
        } else {
            const float denom =
                __fmaf_rn(__fsqrt_rn(second_moment), k.inv_sqrt_bias_correction2, k.eps);
            if constexpr (kKind == kd::kKindAdamW) p = __fmul_rn(p, k.decay_factor);
            p = __fmaf_rn(k.step_size, __fdiv_rn(m, denom), p);
        }
        moment[Slots::kExpAvg] = m;
        moment[Slots::kExpAvgSq] = v;
    } else if constexpr (kKind == kd::kKindAdagrad) {
        g = __fmaf_rn(k.l2_weight_decay, p, g);
        const float v = __fmaf_rn(g, g, moment[Slots::kExpAvgSq]);
        const float denom = __fadd_rn(__fsqrt_rn(v), k.eps);
        p = __fmaf_rn(k.step_size, __fdiv_rn(g, denom), p);
        moment[Slots::kExpAvgSq] = v;
    } else {
        static_assert(kKind == kd::kKindLion);
        const float m = moment[Slots::kExpAvg];
        const float c = __fmaf_rn(k.beta1, m, __fmul_rn(k.one_minus_beta1, g));
        p = __fmul_rn(p, k.decay_factor);
        p = __fmaf_rn(k.step_size, sign_keeping_nan(c), p);
        moment[Slots::kExpAvg] = __fmaf_rn(k.beta2, m, __fmul_rn(k.one_minus_beta2, g));
    }
    p_io = p;
}

__device__ inline void store_copy(void* copy, int copy_index, std::size_t i, float p) {
    if (copy_index == 1) {
        static_cast<__nv_bfloat16*>(copy)[i] = detail::float_to_bf16(p);
    } else if (copy_index == 2) {
        static_cast<__half*>(copy)[i] = detail::float_to_fp16(p);
    }
}

// ---- The kernel ----

// Block b = blockIdx.x holds elements [b * 2048, b * 2048 + n) of the span; thread t its groups
// t and t + 256 (elements 4t .. 4t + 3 and 1024 + 4t ..). Branches on the moment count, the
// unsigned mask and the copy are uniform over the grid.
template <int kState, int kKind, bool kAmsgrad, typename G>
__global__ void __launch_bounds__(kStateThreads)
    state_step_kernel(kd::StateStepArgs a, std::size_t numel, int copy_index) {
    constexpr bool kInt8 = kState == kd::kStateInt8;
    __shared__ std::uint32_t scratch[32];
    const std::size_t block = blockIdx.x;
    const std::size_t begin = block * kBlock;
    const std::size_t n = numel - begin < kBlock ? numel - begin : kBlock;
    const int kept = a.moment_count;
    const G* const grads = static_cast<const G*>(a.step.grads);
    float* const params = a.step.params;

    // The pairs' run keys: a block never crosses a multiple of 2^32 of the global index.
    const std::uint64_t first = a.first_index + begin;
    const std::uint32_t run_keys[2] = {
        rounding_run_key(a.rounding_keys[0], static_cast<std::uint32_t>(first >> 32)),
        rounding_run_key(a.rounding_keys[1], static_cast<std::uint32_t>(first >> 32))};
    float scales[kd::kStepMoments] = {};
    if constexpr (kInt8) {
#pragma unroll
        for (int s = 0; s < kd::kStepMoments; ++s) {
            if (s < kept) scales[s] = a.scales[s][block];
        }
    }
    // int8: the new moments until the scale is known, and their largest magnitudes' bits.
    float held[kd::kStepMoments][kElementsPerThread];
    std::uint32_t max_bits[kd::kStepMoments] = {};

#pragma unroll
    for (int q = 0; q < kGroupsPerThread; ++q) {
        const std::size_t o =
            kGroupNumel * (threadIdx.x + static_cast<std::size_t>(q) * kStateThreads);
        if (o >= n) continue;
#pragma unroll
        for (int e = 0; e < kGroupNumel; ++e) {
            if (o + e >= n) continue;
            const std::size_t i = begin + o + e;
            float moment[kd::kStepMoments] = {};
#pragma unroll
            for (int s = 0; s < kd::kStepMoments; ++s) {
                if (s >= kept) continue;
                if constexpr (kInt8) {
                    moment[s] = decode_int8(static_cast<const std::uint8_t*>(a.stored[s])[i],
                                            scales[s], ((a.unsigned_mask >> s) & 1u) != 0);
                } else {
                    moment[s] =
                        __uint_as_float(static_cast<std::uint32_t>(
                                            static_cast<const std::uint16_t*>(a.stored[s])[i])
                                        << 16);
                }
            }
            float p = params[i];
            update_element<kKind, kAmsgrad>(a.step.c, load_grad(grads, i), p, moment);
            params[i] = p;
            store_copy(a.step.param_copy, copy_index, i, p);
#pragma unroll
            for (int s = 0; s < kd::kStepMoments; ++s) {
                if (s >= kept) continue;
                if constexpr (kInt8) {
                    held[s][kGroupNumel * q + e] = moment[s];
                    const std::uint32_t magnitude = __float_as_uint(moment[s]) & 0x7fffffffu;
                    max_bits[s] = magnitude > max_bits[s] ? magnitude : max_bits[s];
                } else {
                    // Moments 2 * pair and 2 * pair + 1 take the low and the high 16 bits.
                    const std::uint32_t word =
                        rounding_word(run_keys[s / 2], static_cast<std::uint32_t>(first + o + e)) >>
                        (16 * (s % 2));
                    static_cast<std::uint16_t*>(a.stored[s])[i] =
                        float_to_bf16_stochastic(moment[s], word);
                }
            }
        }
    }
    if constexpr (kInt8) {
#pragma unroll
        for (int s = 0; s < kd::kStepMoments; ++s) {
            if (s >= kept) continue;
            // Every thread has read the old scale (above the first barrier of block_max) before
            // thread 0 writes the new one.
            const std::uint32_t largest = detail::block_max(max_bits[s], scratch);
            const float scale =
                __uint_as_float(largest > 0x7f800000u ? kCanonicalNanBits : largest);
            if (threadIdx.x == 0) a.scales[s][block] = scale;
            const float inverse = int8_inverse_scale(scale);
            const bool is_unsigned = ((a.unsigned_mask >> s) & 1u) != 0;
            auto* const codes = static_cast<std::uint8_t*>(a.stored[s]);
#pragma unroll
            for (int q = 0; q < kGroupsPerThread; ++q) {
                const std::size_t o =
                    kGroupNumel * (threadIdx.x + static_cast<std::size_t>(q) * kStateThreads);
#pragma unroll
                for (int e = 0; e < kGroupNumel; ++e) {
                    if (o + e >= n) continue;
                    const std::uint32_t word =
                        rounding_word(run_keys[s / 2], static_cast<std::uint32_t>(first + o + e)) >>
                        (16 * (s % 2));
                    codes[begin + o + e] = encode_int8_stochastic(held[s][kGroupNumel * q + e],
                                                                  inverse, is_unsigned, word);
                }
            }
        }
    }
}

template <int kState, int kKind, bool kAmsgrad, typename G>
Status launch_kernel(const detail::StateLaunch& l, Stream stream) {
    const auto blocks = static_cast<unsigned int>((l.numel + kBlock - 1) / kBlock);
    state_step_kernel<kState, kKind, kAmsgrad, G>
        <<<blocks, kStateThreads, 0, stream>>>(l.args, l.numel, l.copy_index);
    ZINF_CUDA_TRY_LAUNCH("state_step_kernel");
    return Status::ok();
}

template <int kState, int kKind, bool kAmsgrad>
Status launch_grad(const detail::StateLaunch& l, Stream stream) {
    switch (l.grad_dtype) {
        case DType::kFloat32:
            return launch_kernel<kState, kKind, kAmsgrad, float>(l, stream);
        case DType::kBFloat16:
            return launch_kernel<kState, kKind, kAmsgrad, __nv_bfloat16>(l, stream);
        case DType::kFloat16:
            return launch_kernel<kState, kKind, kAmsgrad, __half>(l, stream);
    }
    return Status::invalid_argument("cuda state_step: unknown gradient dtype");
}

template <int kState>
Status launch_kind(const detail::StateLaunch& l, Stream stream) {
    switch (l.kind) {
        case kd::kKindAdam:
            return l.amsgrad ? launch_grad<kState, kd::kKindAdam, true>(l, stream)
                             : launch_grad<kState, kd::kKindAdam, false>(l, stream);
        case kd::kKindAdamW:
            return l.amsgrad ? launch_grad<kState, kd::kKindAdamW, true>(l, stream)
                             : launch_grad<kState, kd::kKindAdamW, false>(l, stream);
        case kd::kKindAdagrad:
            return launch_grad<kState, kd::kKindAdagrad, false>(l, stream);
        case kd::kKindLion:
            return launch_grad<kState, kd::kKindLion, false>(l, stream);
        default:
            break;
    }
    return Status::not_supported("cuda state_step: no kernel for this optimizer");
}

}  // namespace

Status detail::launch_state_step(const StateLaunch& launch, Stream stream) {
    ZINF_ASSERT_GT(launch.numel, std::size_t{0});
    // Adagrad and Lion have no AMSGrad (validate rejects it before).
    if (launch.amsgrad) ZINF_ASSERT(launch.kind == kd::kKindAdam || launch.kind == kd::kKindAdamW);
    if (launch.state == kd::kStateBf16) return launch_kind<kd::kStateBf16>(launch, stream);
    ZINF_ASSERT_EQ(launch.state, kd::kStateInt8);
    return launch_kind<kd::kStateInt8>(launch, stream);
}

}  // namespace zinf::kernels::cuda
