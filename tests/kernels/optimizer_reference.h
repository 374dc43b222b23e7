// The double-precision oracle for the CPU optimizers, with an error scale per output: the sum of
// the magnitudes of the terms that produced it (plus a denormal floor), so that a tolerance
// relative to it holds however much the terms cancel. Also random inputs with the awkward values
// (zeros, denormals, large magnitudes, inf and NaN) that the kernels must handle.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cast.h"
#include "kernels/optimizer.h"

namespace zinf::kernels::test {

// Four times the smallest fp32 denormal: the absolute error of an fp32 value near zero.
inline constexpr double kDenormalFloor = 4.0 * 0x1p-149;
// The documented tolerance of every variant against the oracle (kernels/README.md): 2e-6 of the
// error scale, about 32 fp32 ulps, for a chain of about ten fp32 operations.
inline constexpr double kRelativeTolerance = 2e-6;

struct ReferenceResult {
    double params = 0, exp_avg = 0, exp_avg_sq = 0, max_exp_avg_sq = 0;
    double params_scale = 0, exp_avg_scale = 0, exp_avg_sq_scale = 0, max_exp_avg_sq_scale = 0;
};

struct ReferenceState {
    double params = 0, exp_avg = 0, exp_avg_sq = 0, max_exp_avg_sq = 0;  // the last: AMSGrad
};

// One step for one element, in double, from the given inputs (`grad` is the gradient's value as
// stored, already decoded from bf16/fp16). Follows torch.optim (Adam, AdamW with bias_correction
// on or off and amsgrad, Adagrad) and the Lion paper; the kernels' operation order is not
// assumed. max_exp_avg_sq is computed only with amsgrad.
inline ReferenceResult reference_step(const OptimizerParams& o, const ReferenceState& s,
                                      double grad) {
    ReferenceResult r;
    // An absolute allowance of kDenormalFloor, in the units of the scales (tolerance =
    // kRelativeTolerance * scale): fp32 has only absolute precision among the denormals.
    const double tiny = kDenormalFloor / kRelativeTolerance;
    double g = grad * o.grad_scale;
    double g_scale = std::fabs(g) + tiny;
    const double p = s.params;
    const double m = s.exp_avg;
    const double v = s.exp_avg_sq;
    switch (o.kind) {
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
            double bias_correction1 = 1.0, bias_correction2 = 1.0;
            if (o.bias_correction) {
                bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
                bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
            }
            double p_decayed = p;
            if (o.kind == OptimizerKind::kAdam) {
                if (o.weight_decay != 0.0) {
                    g += o.weight_decay * p;
                    g_scale += o.weight_decay * std::fabs(p);
                }
            } else {
                p_decayed = p * (1.0 - o.lr * o.weight_decay);
            }
            r.exp_avg = o.beta1 * m + (1.0 - o.beta1) * g;
            r.exp_avg_scale = o.beta1 * std::fabs(m) + (1.0 - o.beta1) * g_scale + tiny;
            r.exp_avg_sq = o.beta2 * v + (1.0 - o.beta2) * g * g;
            r.exp_avg_sq_scale =
                o.beta2 * std::fabs(v) + (1.0 - o.beta2) * g_scale * g_scale + tiny;
            double second_moment = r.exp_avg_sq;
            double second_moment_scale = r.exp_avg_sq_scale;
            if (o.amsgrad) {
                // torch.maximum: a NaN on either side is the result.
                const double old_max = s.max_exp_avg_sq;
                r.max_exp_avg_sq = std::isnan(old_max) || std::isnan(r.exp_avg_sq)
                                       ? std::numeric_limits<double>::quiet_NaN()
                                       : (old_max > r.exp_avg_sq ? old_max : r.exp_avg_sq);
                // The maximum moves no more than its arguments do, and the old maximum is an
                // exact input: where fp32 rounding of exp_avg_sq makes the kernel pick the other
                // side, the error is still exp_avg_sq's. Both terms are non-negative, so this
                // scale stays close to the value, as the square root below needs.
                r.max_exp_avg_sq_scale = std::fabs(old_max) + tiny > r.exp_avg_sq_scale
                                             ? std::fabs(old_max) + tiny
                                             : r.exp_avg_sq_scale;
                second_moment = r.max_exp_avg_sq;
                second_moment_scale = r.max_exp_avg_sq_scale;
            }
            const double denom = std::sqrt(second_moment) / std::sqrt(bias_correction2) + o.eps;
            const double denom_scale =
                std::sqrt(second_moment_scale) / std::sqrt(bias_correction2) + o.eps;
            const double step_size = o.lr / bias_correction1;
            r.params = p_decayed - step_size * r.exp_avg / denom;
            r.params_scale = std::fabs(p_decayed) + tiny +
                             step_size * (r.exp_avg_scale / denom +
                                          std::fabs(r.exp_avg) * denom_scale / (denom * denom));
            break;
        }
        case OptimizerKind::kAdagrad: {
            g += o.weight_decay * p;
            g_scale += o.weight_decay * std::fabs(p);
            r.exp_avg_sq = v + g * g;
            r.exp_avg_sq_scale = std::fabs(v) + g_scale * g_scale + tiny;
            const double denom = std::sqrt(r.exp_avg_sq) + o.eps;
            const double denom_scale = std::sqrt(r.exp_avg_sq_scale) + o.eps;
            r.params = p - o.lr * g / denom;
            r.params_scale =
                std::fabs(p) + tiny +
                o.lr * (g_scale / denom + std::fabs(g) * denom_scale / (denom * denom));
            break;
        }
        case OptimizerKind::kLion: {
            const double c = o.beta1 * m + (1.0 - o.beta1) * g;
            const double c_scale = o.beta1 * std::fabs(m) + (1.0 - o.beta1) * g_scale + tiny;
            const double sign = std::isnan(c) ? c : (c > 0) - (c < 0);
            const double p_decayed = p * (1.0 - o.lr * o.weight_decay);
            r.params = p_decayed - o.lr * sign;
            r.params_scale = std::fabs(p_decayed) + o.lr + tiny;
            // Near zero, fp32 rounding may flip the sign of c: allow either update there.
            if (std::fabs(c) <= 1e-5 * c_scale) r.params_scale += 2.0 * o.lr / kRelativeTolerance;
            r.exp_avg = o.beta2 * m + (1.0 - o.beta2) * g;
            r.exp_avg_scale = o.beta2 * std::fabs(m) + (1.0 - o.beta2) * g_scale + tiny;
            break;
        }
    }
    return r;
}

// Whether an fp32 result matches the double oracle: NaN for NaN, the same infinity for an
// infinity or an overflow, else within rtol * scale.
inline bool matches(float actual, double expected, double scale, double rtol) {
    if (std::isnan(expected)) return std::isnan(actual);
    if (std::isinf(expected) ||
        std::fabs(expected) > std::numeric_limits<float>::max() * (1.0 + 0x1p-25)) {
        return std::isinf(actual) && (actual > 0) == (expected > 0);
    }
    if (!std::isfinite(actual)) return false;
    if (!std::isfinite(scale)) return true;
    return std::fabs(static_cast<double>(actual) - expected) <= rtol * scale;
}

// Inputs of one step: fp32 master data and states, and gradients in every dtype (bf16 and fp16
// are the fp32 gradients rounded; `grad_value` decodes the one in use).
struct StepInputs {
    std::vector<float> params, exp_avg, exp_avg_sq, max_exp_avg_sq, grads_fp32;
    std::vector<std::uint16_t> grads_bf16, grads_fp16;

    GradView grad_view(DType dtype) const {
        switch (dtype) {
            case DType::kFloat32:
                return GradView::fp32(grads_fp32);
            case DType::kBFloat16:
                return GradView::bf16(grads_bf16);
            case DType::kFloat16:
                return GradView::fp16(grads_fp16);
        }
        return {};
    }
    double grad_value(DType dtype, std::size_t i) const {
        switch (dtype) {
            case DType::kFloat32:
                return grads_fp32[i];
            case DType::kBFloat16:
                return bf16_to_float(grads_bf16[i]);
            case DType::kFloat16:
                return fp16_to_float(grads_fp16[i]);
        }
        return 0;
    }
};

struct InputMix {
    bool awkward = true;     // zeros, denormals, large magnitudes
    bool non_finite = true;  // inf and NaN gradients
};

inline float random_denormal(std::mt19937_64& rng) {
    std::uniform_int_distribution<std::uint32_t> mantissa(1, 0x7fffff);
    std::bernoulli_distribution negative(0.5);
    return bits_float(mantissa(rng) | (negative(rng) ? 0x80000000u : 0u));
}

inline float log_uniform(std::mt19937_64& rng, double lo_exp10, double hi_exp10,
                         bool signed_value) {
    std::uniform_real_distribution<double> e(lo_exp10, hi_exp10);
    std::bernoulli_distribution negative(0.5);
    const double magnitude = std::pow(10.0, e(rng));
    return static_cast<float>(signed_value && negative(rng) ? -magnitude : magnitude);
}

// One value of a kind picked by `u` in [0, 1): mostly ordinary, a few awkward ones.
inline float awkward_value(std::mt19937_64& rng, double u, double lo, double hi, bool signed_value,
                           const InputMix& mix, bool allow_non_finite) {
    if (mix.awkward) {
        if (u < 0.06) return u < 0.03 ? 0.0f : (signed_value ? -0.0f : 0.0f);
        if (u < 0.12) {
            const float d = random_denormal(rng);
            return signed_value ? d : std::fabs(d);
        }
        if (u < 0.17) return log_uniform(rng, 5, 15, signed_value);
    }
    if (allow_non_finite && mix.non_finite) {
        if (u > 0.97) return std::numeric_limits<float>::quiet_NaN();
        if (u > 0.94)
            return u > 0.955 ? std::numeric_limits<float>::infinity()
                             : -std::numeric_limits<float>::infinity();
    }
    return log_uniform(rng, lo, hi, signed_value);
}

inline StepInputs make_inputs(std::size_t numel, std::uint64_t seed, const InputMix& mix = {}) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    StepInputs in;
    in.params.resize(numel);
    in.exp_avg.resize(numel);
    in.exp_avg_sq.resize(numel);
    in.grads_fp32.resize(numel);
    in.grads_bf16.resize(numel);
    in.grads_fp16.resize(numel);
    for (std::size_t i = 0; i < numel; ++i) {
        in.params[i] = awkward_value(rng, u(rng), -3, 2, true, mix, false);
        in.exp_avg[i] = awkward_value(rng, u(rng), -8, 1, true, mix, false);
        in.exp_avg_sq[i] = awkward_value(rng, u(rng), -16, 2, false, mix, false);
        in.grads_fp32[i] = awkward_value(rng, u(rng), -8, 2, true, mix, true);
        in.grads_bf16[i] = float_to_bf16(in.grads_fp32[i]);
        in.grads_fp16[i] = float_to_fp16(in.grads_fp32[i]);
    }
    // AMSGrad's maximum, drawn like exp_avg_sq and independently of it, so that about half the
    // elements keep their old maximum and half take the new exp_avg_sq; with non-finite inputs,
    // a few are NaN or +inf left by an earlier overflow (which the maximum keeps). Its own
    // generator keeps the other arrays what they were for a given seed before this state existed.
    std::mt19937_64 max_rng(seed ^ 0x9e3779b97f4a7c15u);
    in.max_exp_avg_sq.resize(numel);
    for (std::size_t i = 0; i < numel; ++i) {
        const double pick = u(max_rng);
        float value = awkward_value(max_rng, u(max_rng), -16, 2, false, mix, false);
        if (mix.non_finite && pick < 0.02) value = std::numeric_limits<float>::quiet_NaN();
        if (mix.non_finite && pick >= 0.02 && pick < 0.03)
            value = std::numeric_limits<float>::infinity();
        in.max_exp_avg_sq[i] = value;
    }
    return in;
}

}  // namespace zinf::kernels::test
