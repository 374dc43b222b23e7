// Adam / AdamW on the GPU: one fused grid-stride kernel reading the gradient and the three fp32
// states once and writing them once (28 bytes per parameter with fp32 gradients; AMSGrad adds
// its fourth state, 8 bytes more). The host wrapper, adam_step, is in adam.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/adam_launch.h"
#include "kernels/cuda/detail/half_bits.cuh"
#include "kernels/cuda/detail/launch.cuh"

namespace zinf::kernels::cuda {
namespace {

__device__ inline float load_float(const float* p, std::size_t i) {
    return p[i];
}
__device__ inline float load_float(const __nv_bfloat16* p, std::size_t i) {
    return detail::bf16_to_float(p[i]);
}
__device__ inline float load_float(const __half* p, std::size_t i) {
    return detail::fp16_to_float(p[i]);
}

__device__ inline void store_float(float* p, std::size_t i, float v) {
    p[i] = v;
}
__device__ inline void store_float(__nv_bfloat16* p, std::size_t i, float v) {
    p[i] = detail::float_to_bf16(v);
}
__device__ inline void store_float(__half* p, std::size_t i, float v) {
    p[i] = detail::float_to_fp16(v);
}

// The CPU variants' max (V::max in kernels/detail/optimizer_body.h): a when a is NaN, else b
// unless a > b. Written out because fmaxf would drop a NaN, where torch.maximum keeps it.
__device__ inline float max_keeping_nan(float a, float b) {
    if (isnan(a)) return a;
    return a > b ? a : b;
}

// One element per iteration, in the CPU kernel's order with every rounding explicit (no
// contraction left to the compiler): the results are bitwise those of the CPU optimizer's FMA
// variants. kL2 (Adam with weight decay) adds the L2 term; without it the term is not computed
// at all, since 0 * p would turn an infinite parameter into NaN. kAmsgrad keeps the running
// maximum of exp_avg_sq in max_exp_avg_sq (null otherwise) and divides by its square root.
template <typename G, typename C, bool kL2, bool kAmsgrad>
__global__ void adam_kernel(float* __restrict__ params, const G* __restrict__ grads,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            float* __restrict__ max_exp_avg_sq, C* __restrict__ param_copy,
                            std::size_t numel, kernels::detail::StepConstants s) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < numel;
         i += stride) {
        float p = params[i];
        float g = __fmul_rn(load_float(grads, i), s.grad_scale);
        if constexpr (kL2) g = __fmaf_rn(s.l2_weight_decay, p, g);
        const float m = __fmaf_rn(s.beta1, exp_avg[i], __fmul_rn(s.one_minus_beta1, g));
        const float v =
            __fmaf_rn(s.beta2, exp_avg_sq[i], __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
        float second_moment = v;
        if constexpr (kAmsgrad) {
            second_moment = max_keeping_nan(max_exp_avg_sq[i], v);
            max_exp_avg_sq[i] = second_moment;
        }
        const float denom =
            __fmaf_rn(__fsqrt_rn(second_moment), s.inv_sqrt_bias_correction2, s.eps);
        p = __fmul_rn(p, s.decay_factor);
        p = __fmaf_rn(s.step_size, __fdiv_rn(m, denom), p);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        params[i] = p;
        if (param_copy != nullptr) store_float(param_copy, i, p);
    }
}

template <typename G, typename C, bool kL2, bool kAmsgrad>
void launch_kernel(float* params, const G* grads, float* exp_avg, float* exp_avg_sq,
                   float* max_exp_avg_sq, void* param_copy, std::size_t numel,
                   const kernels::detail::StepConstants& s, Stream stream) {
    adam_kernel<G, C, kL2, kAmsgrad><<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(
        params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, static_cast<C*>(param_copy), numel, s);
}

template <typename G, typename C>
Status launch(float* params, const G* grads, float* exp_avg, float* exp_avg_sq,
              float* max_exp_avg_sq, void* param_copy, std::size_t numel,
              const kernels::detail::StepConstants& s, bool l2, Stream stream) {
    const bool amsgrad = max_exp_avg_sq != nullptr;
    if (l2 && amsgrad) {
        launch_kernel<G, C, true, true>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                        param_copy, numel, s, stream);
    } else if (l2) {
        launch_kernel<G, C, true, false>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                         param_copy, numel, s, stream);
    } else if (amsgrad) {
        launch_kernel<G, C, false, true>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                         param_copy, numel, s, stream);
    } else {
        launch_kernel<G, C, false, false>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                          param_copy, numel, s, stream);
    }
    ZINF_CUDA_TRY_LAUNCH("adam_kernel");
    return Status::ok();
}

template <typename G>
Status launch_grad(float* params, const G* grads, float* exp_avg, float* exp_avg_sq,
                   float* max_exp_avg_sq, void* param_copy, DType copy_dtype, std::size_t numel,
                   const kernels::detail::StepConstants& s, bool l2, Stream stream) {
    // Without a copy the float instantiation runs with a null pointer (the branch is uniform).
    if (param_copy == nullptr || copy_dtype == DType::kFloat32) {
        return launch<G, float>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy,
                                numel, s, l2, stream);
    }
    if (copy_dtype == DType::kBFloat16) {
        return launch<G, __nv_bfloat16>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                        param_copy, numel, s, l2, stream);
    }
    return launch<G, __half>(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy, numel,
                             s, l2, stream);
}

}  // namespace

Status detail::launch_adam(float* params, const void* grads, DType grad_dtype, float* exp_avg,
                           float* exp_avg_sq, float* max_exp_avg_sq, std::size_t numel,
                           const kernels::detail::StepConstants& s, bool l2, void* param_copy,
                           DType param_copy_dtype, Stream stream) {
    switch (grad_dtype) {
        case DType::kFloat32:
            return launch_grad(params, static_cast<const float*>(grads), exp_avg, exp_avg_sq,
                               max_exp_avg_sq, param_copy, param_copy_dtype, numel, s, l2, stream);
        case DType::kBFloat16:
            return launch_grad(params, static_cast<const __nv_bfloat16*>(grads), exp_avg,
                               exp_avg_sq, max_exp_avg_sq, param_copy, param_copy_dtype, numel, s,
                               l2, stream);
        case DType::kFloat16:
            return launch_grad(params, static_cast<const __half*>(grads), exp_avg, exp_avg_sq,
                               max_exp_avg_sq, param_copy, param_copy_dtype, numel, s, l2, stream);
    }
    return Status::invalid_argument("launch_adam: unknown gradient dtype");
}

}  // namespace zinf::kernels::cuda
