// Private: the optimizer, reduction and cast loops, written once over a vector-operations type V
// and instantiated by each per-ISA unit with its own V (Avx512Ops, Avx2Ops, ScalarOps).
//
// Why everything here is a template on V: each per-ISA unit is compiled with different -m
// flags, and V is declared in an anonymous namespace there, so every instantiation has internal
// linkage. A plain inline function in this header would instead be emitted by several units
// and merged by the linker, which could hand AVX-512 code to a CPU without it. Keep it so: no
// non-template inline functions and no standard-library algorithms in this header.
//
// V provides: F (the float vector), kLanes, load/store (fp32), load_bf16/load_fp16,
// store_bf16/store_fp16, set1, add, mul, div, sqrt, fmadd(a, b, c) = a * b + c, sign (-1, 0, +1,
// NaN stays NaN), max(a, b) (a when a is NaN, else b when b is NaN, else the larger, b on a tie
// such as +0 and -0: torch.maximum's NaN propagation, with every case pinned so that widths
// agree), and a sum-of-squares accumulator Acc with acc_zero, acc_add_squares and acc_total.
// Operations are exact IEEE fp32 (no approximations), so two V with the same fmadd give
// bitwise-identical results whatever their width.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/detail/kernel_table.h"

namespace zinf::kernels::detail {

inline constexpr int kGradFp32 = 0;
inline constexpr int kGradBf16 = 1;
inline constexpr int kGradFp16 = 2;
inline constexpr int kCopyNone = 0;
inline constexpr int kCopyBf16 = 1;
inline constexpr int kCopyFp16 = 2;

template <int kGrad>
struct GradElement {
    using Type = std::uint16_t;
};
template <>
struct GradElement<kGradFp32> {
    using Type = float;
};

// The step constants broadcast once per chunk.
template <class V>
struct VectorConstants {
    using F = typename V::F;
    explicit VectorConstants(const StepConstants& c) noexcept
        : grad_scale(V::set1(c.grad_scale)),
          beta1(V::set1(c.beta1)),
          one_minus_beta1(V::set1(c.one_minus_beta1)),
          beta2(V::set1(c.beta2)),
          one_minus_beta2(V::set1(c.one_minus_beta2)),
          eps(V::set1(c.eps)),
          step_size(V::set1(c.step_size)),
          inv_sqrt_bias_correction2(V::set1(c.inv_sqrt_bias_correction2)),
          sqrt_bias_correction2(V::set1(c.sqrt_bias_correction2)),
          l2_weight_decay(V::set1(c.l2_weight_decay)),
          decay_factor(V::set1(c.decay_factor)),
          torch_rounding(c.torch_rounding != 0) {}
    F grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size,
        inv_sqrt_bias_correction2, sqrt_bias_correction2, l2_weight_decay, decay_factor;
    bool torch_rounding;
};

template <class V, int kGrad>
typename V::F load_grad(const void* grads, std::size_t index) noexcept {
    if constexpr (kGrad == kGradFp32) {
        return V::load(static_cast<const float*>(grads) + index);
    } else if constexpr (kGrad == kGradBf16) {
        return V::load_bf16(static_cast<const std::uint16_t*>(grads) + index);
    } else {
        return V::load_fp16(static_cast<const std::uint16_t*>(grads) + index);
    }
}

template <class V, int kCopy>
void store_copy(void* copy, std::size_t index, typename V::F p) noexcept {
    if constexpr (kCopy == kCopyBf16) {
        V::store_bf16(static_cast<std::uint16_t*>(copy) + index, p);
    } else if constexpr (kCopy == kCopyFp16) {
        V::store_fp16(static_cast<std::uint16_t*>(copy) + index, p);
    }
}

// The registers of one vector of elements: the parameters, the gradient as loaded (unscaled),
// and the moments the kind keeps (the others unused).
template <class V>
struct LaneValues {
    typename V::F p, g, m, v, v_max;
};

// The update of one vector of elements in registers: p and the kept moments in place. The
// operation order is the contract that the reference in tests/kernels/optimizer_reference.h
// mirrors (and kernels/cuda/adam.cu copies); change them together. kAmsgrad (Adam, AdamW only)
// keeps v_max = max(v_max, v) and divides by its square root instead of v's, as
// torch.optim.Adam(amsgrad=True) does.
template <class V, int kKind, bool kAmsgrad>
[[gnu::always_inline]] inline void update_lanes(const VectorConstants<V>& k,
                                                LaneValues<V>& x) noexcept {
    using F = typename V::F;
    static_assert(!kAmsgrad || kKind == kKindAdam || kKind == kKindAdamW);
    F g = V::mul(x.g, k.grad_scale);
    F p = x.p;
    if constexpr (kKind == kKindAdam || kKind == kKindAdamW) {
        if constexpr (kKind == kKindAdam) g = V::fmadd(k.l2_weight_decay, p, g);
        F m = x.m;
        F v = x.v;
        if (k.torch_rounding) {
            // torch: exp_avg.mul_(b1).add_(g, alpha=1-b1) (Vectorized fmadd);
            // exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2): (value*g)*g + self, contracted.
            m = V::fmadd(g, k.one_minus_beta1, V::mul(m, k.beta1));
            v = V::fmadd(V::mul(k.one_minus_beta2, g), g, V::mul(v, k.beta2));
        } else {
            m = V::fmadd(k.beta1, m, V::mul(k.one_minus_beta1, g));
            v = V::fmadd(k.beta2, v, V::mul(V::mul(k.one_minus_beta2, g), g));
        }
        F second_moment = v;
        if constexpr (kAmsgrad) {
            second_moment = V::max(x.v_max, v);
            x.v_max = second_moment;
        }
        if (k.torch_rounding) {
            // torch: denom = (sqrt(v) / sqrt(bc2)).add_(eps); p.mul_(1 - lr*wd);
            // p.addcdiv_(m, denom, value=-step_size): p + (value * m) / denom.
            const F denom = V::add(V::div(V::sqrt(second_moment), k.sqrt_bias_correction2), k.eps);
            if constexpr (kKind == kKindAdamW) p = V::mul(p, k.decay_factor);
            p = V::add(p, V::div(V::mul(k.step_size, m), denom));
        } else {
            const F denom = V::fmadd(V::sqrt(second_moment), k.inv_sqrt_bias_correction2, k.eps);
            if constexpr (kKind == kKindAdamW) p = V::mul(p, k.decay_factor);
            p = V::fmadd(k.step_size, V::div(m, denom), p);
        }
        x.m = m;
        x.v = v;
    } else if constexpr (kKind == kKindAdagrad) {
        g = V::fmadd(k.l2_weight_decay, p, g);
        const F v = V::fmadd(g, g, x.v);
        const F denom = V::add(V::sqrt(v), k.eps);
        p = V::fmadd(k.step_size, V::div(g, denom), p);
        x.v = v;
    } else {
        static_assert(kKind == kKindLion);
        const F m = x.m;
        const F c = V::fmadd(k.beta1, m, V::mul(k.one_minus_beta1, g));
        p = V::mul(p, k.decay_factor);
        p = V::fmadd(k.step_size, V::sign(c), p);
        x.m = V::fmadd(k.beta2, m, V::mul(k.one_minus_beta2, g));
    }
    x.p = p;
}

// One vector of fp32 elements at `index`: update_lanes between loads and stores.
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void step_lanes(const VectorConstants<V>& k, float* params, float* exp_avg, float* exp_avg_sq,
                float* max_exp_avg_sq, const void* grads, void* copy, std::size_t index) noexcept {
    constexpr bool kUsesExpAvg = kKind != kKindAdagrad;
    constexpr bool kUsesExpAvgSq = kKind != kKindLion;
    LaneValues<V> x{};
    x.g = load_grad<V, kGrad>(grads, index);
    x.p = V::load(params + index);
    if constexpr (kUsesExpAvg) x.m = V::load(exp_avg + index);
    if constexpr (kUsesExpAvgSq) x.v = V::load(exp_avg_sq + index);
    if constexpr (kAmsgrad) x.v_max = V::load(max_exp_avg_sq + index);
    update_lanes<V, kKind, kAmsgrad>(k, x);
    if constexpr (kUsesExpAvg) V::store(exp_avg + index, x.m);
    if constexpr (kUsesExpAvgSq) V::store(exp_avg_sq + index, x.v);
    if constexpr (kAmsgrad) V::store(max_exp_avg_sq + index, x.v_max);
    V::store(params + index, x.p);
    store_copy<V, kCopy>(copy, index, x.p);
}

// Where each built-in kind keeps its moments in StepArgs::moments (the order of its
// OptimizerDescriptor): Adam and AdamW exp_avg, exp_avg_sq, max_exp_avg_sq; Adagrad its running
// sum (exp_avg_sq); Lion exp_avg.
template <int kKind>
struct MomentSlots {
    static constexpr int kExpAvg = kKind == kKindAdagrad ? -1 : 0;
    static constexpr int kExpAvgSq = kKind == kKindLion ? -1 : kKind == kKindAdagrad ? 0 : 1;
    static constexpr int kMaxExpAvgSq = 2;
};

template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void step_chunk(const StepArgs& a, std::size_t begin, std::size_t end) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    using Slots = MomentSlots<kKind>;
    constexpr bool kUsesExpAvg = Slots::kExpAvg >= 0;
    constexpr bool kUsesExpAvgSq = Slots::kExpAvgSq >= 0;
    float* const exp_avg = kUsesExpAvg ? a.moments[kUsesExpAvg ? Slots::kExpAvg : 0] : nullptr;
    float* const exp_avg_sq =
        kUsesExpAvgSq ? a.moments[kUsesExpAvgSq ? Slots::kExpAvgSq : 0] : nullptr;
    float* const max_exp_avg_sq = kAmsgrad ? a.moments[Slots::kMaxExpAvgSq] : nullptr;
    const VectorConstants<V> k(a.c);
    std::size_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
        step_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, a.params, exp_avg, exp_avg_sq,
                                                     max_exp_avg_sq, a.grads, a.param_copy, i);
    }
    if (i == end) return;
    // The tail runs the same vector code on zero-padded copies: every element then sees the
    // same operations wherever it sits, and no load or store crosses the end of a span.
    using G = typename GradElement<kGrad>::Type;
    const std::size_t rest = end - i;
    alignas(64) float p[kLanes] = {};
    alignas(64) float m[kLanes] = {};
    alignas(64) float v[kLanes] = {};
    alignas(64) float v_max[kLanes] = {};
    alignas(64) G g[kLanes] = {};
    alignas(64) std::uint16_t copy[kLanes] = {};
    std::memcpy(p, a.params + i, rest * sizeof(float));
    if constexpr (kUsesExpAvg) std::memcpy(m, exp_avg + i, rest * sizeof(float));
    if constexpr (kUsesExpAvgSq) std::memcpy(v, exp_avg_sq + i, rest * sizeof(float));
    if constexpr (kAmsgrad) std::memcpy(v_max, max_exp_avg_sq + i, rest * sizeof(float));
    std::memcpy(g, static_cast<const G*>(a.grads) + i, rest * sizeof(G));
    step_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, p, m, v, v_max, g, copy, 0);
    std::memcpy(a.params + i, p, rest * sizeof(float));
    if constexpr (kUsesExpAvg) std::memcpy(exp_avg + i, m, rest * sizeof(float));
    if constexpr (kUsesExpAvgSq) std::memcpy(exp_avg_sq + i, v, rest * sizeof(float));
    if constexpr (kAmsgrad) std::memcpy(max_exp_avg_sq + i, v_max, rest * sizeof(float));
    if constexpr (kCopy != kCopyNone) {
        std::memcpy(static_cast<std::uint16_t*>(a.param_copy) + i, copy,
                    rest * sizeof(std::uint16_t));
    }
}

template <class V, int kGrad>
double sum_squares_chunk(const void* grads, std::size_t begin, std::size_t end) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    typename V::Acc acc = V::acc_zero();
    std::size_t i = begin;
    for (; i + kLanes <= end; i += kLanes) V::acc_add_squares(acc, load_grad<V, kGrad>(grads, i));
    if (i < end) {
        // Zero padding adds +0 to the idle lanes, which leaves every lane sum unchanged.
        using G = typename GradElement<kGrad>::Type;
        alignas(64) G g[kLanes] = {};
        std::memcpy(g, static_cast<const G*>(grads) + i, (end - i) * sizeof(G));
        V::acc_add_squares(acc, load_grad<V, kGrad>(g, 0));
    }
    return V::acc_total(acc);
}

template <class V, int kCopy>
void cast_from_fp32_chunk(const float* src, std::uint16_t* dst, std::size_t numel) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    std::size_t i = 0;
    for (; i + kLanes <= numel; i += kLanes) store_copy<V, kCopy>(dst, i, V::load(src + i));
    if (i == numel) return;
    alignas(64) float s[kLanes] = {};
    alignas(64) std::uint16_t d[kLanes] = {};
    std::memcpy(s, src + i, (numel - i) * sizeof(float));
    store_copy<V, kCopy>(d, 0, V::load(s));
    std::memcpy(dst + i, d, (numel - i) * sizeof(std::uint16_t));
}

template <class V, int kGrad>
void cast_to_fp32_chunk(const std::uint16_t* src, float* dst, std::size_t numel) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    std::size_t i = 0;
    for (; i + kLanes <= numel; i += kLanes) V::store(dst + i, load_grad<V, kGrad>(src, i));
    if (i == numel) return;
    alignas(64) std::uint16_t s[kLanes] = {};
    alignas(64) float d[kLanes] = {};
    std::memcpy(s, src + i, (numel - i) * sizeof(std::uint16_t));
    V::store(d, load_grad<V, kGrad>(s, 0));
    std::memcpy(dst + i, d, (numel - i) * sizeof(float));
}

template <class V, int kKind, bool kAmsgrad, int kGrad>
constexpr void set_step_entries(KernelTable& t) noexcept {
    auto& entries = t.step[kKind][kAmsgrad ? 1 : 0][kGrad];
    entries[kCopyNone] = &step_chunk<V, kKind, kAmsgrad, kGrad, kCopyNone>;
    entries[kCopyBf16] = &step_chunk<V, kKind, kAmsgrad, kGrad, kCopyBf16>;
    entries[kCopyFp16] = &step_chunk<V, kKind, kAmsgrad, kGrad, kCopyFp16>;
}

template <class V, int kKind, bool kAmsgrad>
constexpr void set_kind_entries(KernelTable& t) noexcept {
    set_step_entries<V, kKind, kAmsgrad, kGradFp32>(t);
    set_step_entries<V, kKind, kAmsgrad, kGradBf16>(t);
    set_step_entries<V, kKind, kAmsgrad, kGradFp16>(t);
}

template <class V>
constexpr KernelTable make_kernel_table() noexcept {
    KernelTable t{};
    set_kind_entries<V, kKindAdam, false>(t);
    set_kind_entries<V, kKindAdamW, false>(t);
    set_kind_entries<V, kKindAdagrad, false>(t);
    set_kind_entries<V, kKindLion, false>(t);
    // AMSGrad exists for Adam and AdamW only; the other kinds' entries stay null.
    set_kind_entries<V, kKindAdam, true>(t);
    set_kind_entries<V, kKindAdamW, true>(t);
    t.sum_squares[kGradFp32] = &sum_squares_chunk<V, kGradFp32>;
    t.sum_squares[kGradBf16] = &sum_squares_chunk<V, kGradBf16>;
    t.sum_squares[kGradFp16] = &sum_squares_chunk<V, kGradFp16>;
    t.from_fp32[0] = &cast_from_fp32_chunk<V, kCopyBf16>;
    t.from_fp32[1] = &cast_from_fp32_chunk<V, kCopyFp16>;
    t.to_fp32[0] = &cast_to_fp32_chunk<V, kGradBf16>;
    t.to_fp32[1] = &cast_to_fp32_chunk<V, kGradFp16>;
    t.sum_lanes = V::kAccLanes;
    return t;
}

}  // namespace zinf::kernels::detail
