// Adam / AdamW on the GPU: one fused grid-stride kernel reading the gradient and the three fp32
// states once and writing them once (28 bytes per parameter with fp32 gradients).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/adam.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/detail/launch.cuh"

namespace zinf::kernels::cuda {
namespace {

__device__ inline float load_float(const float* p, std::size_t i) {
    return p[i];
}
__device__ inline float load_float(const __nv_bfloat16* p, std::size_t i) {
    return __bfloat162float(p[i]);
}
__device__ inline float load_float(const __half* p, std::size_t i) {
    return __half2float(p[i]);
}

__device__ inline void store_float(float* p, std::size_t i, float v) {
    p[i] = v;
}
__device__ inline void store_float(__nv_bfloat16* p, std::size_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}
__device__ inline void store_float(__half* p, std::size_t i, float v) {
    p[i] = __float2half_rn(v);
}

// Scalars derived once on the host, in double, so every element uses the same values.
struct AdamScalars {
    float beta1;
    float beta2;
    float one_minus_beta1;
    float one_minus_beta2;
    float eps;
    float step_size;        // lr / (1 - beta1^step)
    float inv_sqrt_bias2;   // 1 / sqrt(1 - beta2^step)
    float decoupled_decay;  // 1 - lr * weight_decay in AdamW mode, else 1
    float l2_decay;         // weight_decay in Adam (L2) mode, else 0
    float grad_scale;
};

template <typename G, typename C>
__global__ void adam_kernel(float* __restrict__ params, const G* __restrict__ grads,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            C* __restrict__ param_copy, std::size_t numel, AdamScalars s) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < numel;
         i += stride) {
        float p = params[i];
        float g = load_float(grads, i) * s.grad_scale;
        g = fmaf(s.l2_decay, p, g);
        const float m = fmaf(s.beta1, exp_avg[i], s.one_minus_beta1 * g);
        const float v = fmaf(s.beta2, exp_avg_sq[i], s.one_minus_beta2 * g * g);
        const float denom = sqrtf(v) * s.inv_sqrt_bias2 + s.eps;
        p = p * s.decoupled_decay - s.step_size * (m / denom);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        params[i] = p;
        if (param_copy != nullptr) store_float(param_copy, i, p);
    }
}

template <typename G, typename C>
Status launch(float* params, const G* grads, float* exp_avg, float* exp_avg_sq, void* param_copy,
              std::size_t numel, const AdamScalars& s, Stream stream) {
    adam_kernel<G, C><<<detail::grid_for(numel), detail::kBlockThreads, 0, stream>>>(
        params, grads, exp_avg, exp_avg_sq, static_cast<C*>(param_copy), numel, s);
    ZINF_CUDA_TRY_LAUNCH("adam_kernel");
    return Status::ok();
}

template <typename G>
Status launch_grad(float* params, const G* grads, float* exp_avg, float* exp_avg_sq,
                   void* param_copy, DType copy_dtype, std::size_t numel, const AdamScalars& s,
                   Stream stream) {
    // Without a copy the float instantiation runs with a null pointer (the branch is uniform).
    if (param_copy == nullptr || copy_dtype == DType::kFloat32) {
        return launch<G, float>(params, grads, exp_avg, exp_avg_sq, param_copy, numel, s, stream);
    }
    if (copy_dtype == DType::kBFloat16) {
        return launch<G, __nv_bfloat16>(params, grads, exp_avg, exp_avg_sq, param_copy, numel, s,
                                        stream);
    }
    return launch<G, __half>(params, grads, exp_avg, exp_avg_sq, param_copy, numel, s, stream);
}

}  // namespace

Status adam_step(float* params, const void* grads, DType grad_dtype, float* exp_avg,
                 float* exp_avg_sq, std::size_t numel, const AdamStepParams& p, void* param_copy,
                 DType param_copy_dtype, Stream stream) {
    if (numel == 0) return Status::ok();
    ZINF_ASSERT(params != nullptr);
    ZINF_ASSERT(grads != nullptr);
    ZINF_ASSERT(exp_avg != nullptr);
    ZINF_ASSERT(exp_avg_sq != nullptr);
    ZINF_ASSERT_GE(p.step, std::int64_t{1});
    ZINF_ASSERT_GE(p.beta1, 0.0f);
    ZINF_ASSERT_LT(p.beta1, 1.0f);
    ZINF_ASSERT_GE(p.beta2, 0.0f);
    ZINF_ASSERT_LT(p.beta2, 1.0f);

    const double bias1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
    const double bias2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
    AdamScalars s{};
    s.beta1 = p.beta1;
    s.beta2 = p.beta2;
    s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(p.beta1));
    s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(p.beta2));
    s.eps = p.eps;
    s.step_size = static_cast<float>(static_cast<double>(p.lr) / bias1);
    s.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
    s.decoupled_decay = p.adam_w_mode
                            ? static_cast<float>(1.0 - static_cast<double>(p.lr) *
                                                           static_cast<double>(p.weight_decay))
                            : 1.0f;
    s.l2_decay = p.adam_w_mode ? 0.0f : p.weight_decay;
    s.grad_scale = p.grad_scale;

    switch (grad_dtype) {
        case DType::kFloat32:
            return launch_grad(params, static_cast<const float*>(grads), exp_avg, exp_avg_sq,
                               param_copy, param_copy_dtype, numel, s, stream);
        case DType::kBFloat16:
            return launch_grad(params, static_cast<const __nv_bfloat16*>(grads), exp_avg,
                               exp_avg_sq, param_copy, param_copy_dtype, numel, s, stream);
        case DType::kFloat16:
            return launch_grad(params, static_cast<const __half*>(grads), exp_avg, exp_avg_sq,
                               param_copy, param_copy_dtype, numel, s, stream);
    }
    return Status::invalid_argument("adam_step: unknown gradient dtype");
}

}  // namespace zinf::kernels::cuda
