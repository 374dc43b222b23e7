// Private: the optimizer step over compressed moments (bf16 with stochastic rounding, int8
// blockwise), written once over a vector-operations type V and instantiated by each
// optimizer_states_<isa>.cc unit with its own V (the same rules as optimizer_body.h: only
// templates here, no non-template inline functions, no standard-library algorithms).
//
// Per block of 2048 elements (kStateBlockNumel; the global flat index's blocks): decode the
// stored moments into fp32 buffers, run step_lanes (the fp32 step, the same element code) on
// them, encode them back. One pass over memory; the buffers stay in L1/L2.
//
// V adds to optimizer_body.h's operations: abs; load_int8<kUnsigned>(codes, scale) and
// store_int8<kUnsigned>(codes, x, inv_scale) (kernels/state_codec.h's decode_int8 and
// encode_int8); store_bf16_stochastic(dst, x, words, shift) (float_to_bf16_stochastic with
// (word >> shift) & 0xffff); philox_words(out, seed, stream, first_index, count): the Philox
// words of elements first_index .. first_index + count, first_index and count multiples of
// kRoundingBatch. Its fmadd must be fused (the scalar unit uses std::fma), so that every
// variant gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/detail/optimizer_body.h"
#include "kernels/detail/state_table.h"

namespace zinf::kernels::detail {

// The Philox words are made this many at a time (the AVX-512 width times Philox's four words).
inline constexpr std::size_t kRoundingBatch = 64;
inline constexpr std::size_t kBlock = kStateBlockNumel;
static_assert(kBlock % kRoundingBatch == 0);

template <class V>
constexpr std::size_t round_up_lanes(std::size_t n) noexcept {
    return (n + V::kLanes - 1) / V::kLanes * V::kLanes;
}

// One block's fp32 moments and rounding words: 32 KiB of the caller's stack.
struct StateBlockBuffers {
    alignas(64) float moments[kStepMoments][kBlock];
    alignas(64) std::uint32_t words[kBlock];
};

template <class V, bool kUnsigned>
void decode_int8_block(const std::uint8_t* codes, float scale, std::size_t n, float* out) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    const typename V::F s = V::set1(scale);
    std::size_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        V::store(out + j, V::template load_int8<kUnsigned>(codes + j, s));
    if (j == n) return;
    alignas(64) std::uint8_t tail[kLanes] = {};
    std::memcpy(tail, codes + j, n - j);
    V::store(out + j, V::template load_int8<kUnsigned>(tail, s));
}

// Moment k of the block at `b` (n elements) into out[0, round_up_lanes(n)); the padding lanes
// decode from zero codes.
template <class V, int kState>
void decode_moment_block(const StateStepArgs& a, int k, std::size_t b, std::size_t n,
                         float* out) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    if constexpr (kState == kStateBf16) {
        const std::uint16_t* src = static_cast<const std::uint16_t*>(a.stored[k]) + b;
        std::size_t j = 0;
        for (; j + kLanes <= n; j += kLanes) V::store(out + j, V::load_bf16(src + j));
        if (j == n) return;
        alignas(64) std::uint16_t tail[kLanes] = {};
        std::memcpy(tail, src + j, (n - j) * sizeof(std::uint16_t));
        V::store(out + j, V::load_bf16(tail));
    } else {
        const std::uint8_t* src = static_cast<const std::uint8_t*>(a.stored[k]) + b;
        const float scale = a.scales[k][b / kBlock];
        if (((a.unsigned_mask >> k) & 1u) != 0) {
            decode_int8_block<V, true>(src, scale, n, out);
        } else {
            decode_int8_block<V, false>(src, scale, n, out);
        }
    }
}

// The largest magnitude of x[0, padded), NaN as the one quiet NaN: the same bits in every
// variant (max of magnitudes is exact and order-free; a NaN is canonicalised).
template <class V>
float block_max_magnitude(const float* x, std::size_t padded) noexcept {
    typename V::F acc = V::set1(0.0f);
    for (std::size_t j = 0; j < padded; j += V::kLanes) acc = V::max(acc, V::abs(V::load(x + j)));
    alignas(64) float lanes[V::kLanes];
    V::store(lanes, acc);
    float m = 0.0f;
    for (const float lane : lanes) {
        if (lane != lane) {
            const std::uint32_t nan_bits = 0x7fc00000u;
            std::memcpy(&m, &nan_bits, sizeof m);
            return m;
        }
        if (lane > m) m = lane;
    }
    return m;
}

template <class V, bool kUnsigned>
void encode_int8_block(const float* x, float inv_scale, std::size_t n,
                       std::uint8_t* codes) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    const typename V::F inv = V::set1(inv_scale);
    std::size_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        V::template store_int8<kUnsigned>(codes + j, V::load(x + j), inv);
    if (j == n) return;
    alignas(64) std::uint8_t tail[kLanes] = {};
    V::template store_int8<kUnsigned>(tail, V::load(x + j), inv);
    std::memcpy(codes + j, tail, n - j);
}

// Moment k of the block from x[0, round_up_lanes(n)) (zero past n) back into its store; int8
// takes the block's new largest magnitude as its scale first.
template <class V, int kState>
void encode_moment_block(const StateStepArgs& a, int k, std::size_t b, std::size_t n,
                         const float* x, std::uint32_t* words) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    if constexpr (kState == kStateBf16) {
        if (k % 2 == 0) {
            const std::size_t count = (n + kRoundingBatch - 1) / kRoundingBatch * kRoundingBatch;
            V::philox_words(words, a.rounding_seed, a.rounding_streams[k / 2], a.first_index + b,
                            count);
        }
        const int shift = 16 * (k % 2);
        std::uint16_t* dst = static_cast<std::uint16_t*>(a.stored[k]) + b;
        std::size_t j = 0;
        for (; j + kLanes <= n; j += kLanes) {
            V::store_bf16_stochastic(dst + j, V::load(x + j), words + j, shift);
        }
        if (j == n) return;
        alignas(64) std::uint16_t tail[kLanes] = {};
        V::store_bf16_stochastic(tail, V::load(x + j), words + j, shift);
        std::memcpy(dst + j, tail, (n - j) * sizeof(std::uint16_t));
    } else {
        const float scale = block_max_magnitude<V>(x, round_up_lanes<V>(n));
        a.scales[k][b / kBlock] = scale;
        // kernels/state_codec.h's int8_inverse_scale: 0 unless the scale is a finite normal.
        const float inv = scale >= 0x1p-126f && scale <= 0x1.fffffep+127f ? 1.0f / scale : 0.0f;
        std::uint8_t* dst = static_cast<std::uint8_t*>(a.stored[k]) + b;
        if (((a.unsigned_mask >> k) & 1u) != 0) {
            encode_int8_block<V, true>(x, inv, n, dst);
        } else {
            encode_int8_block<V, false>(x, inv, n, dst);
        }
    }
}

// The fp32 step over the block's decoded moments m (padded to whole vectors): params, grads and
// the copy in place from b, the tail through zero-padded copies as step_chunk does.
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void step_block(const StateStepArgs& a, std::size_t b, std::size_t n,
                StateBlockBuffers& buffers) noexcept {
    constexpr std::size_t kLanes = V::kLanes;
    using Slots = MomentSlots<kKind>;
    using G = typename GradElement<kGrad>::Type;
    float* exp_avg =
        Slots::kExpAvg >= 0 ? buffers.moments[Slots::kExpAvg < 0 ? 0 : Slots::kExpAvg] : nullptr;
    float* exp_avg_sq = Slots::kExpAvgSq >= 0
                            ? buffers.moments[Slots::kExpAvgSq < 0 ? 0 : Slots::kExpAvgSq]
                            : nullptr;
    float* max_exp_avg_sq = kAmsgrad ? buffers.moments[Slots::kMaxExpAvgSq] : nullptr;
    const VectorConstants<V> k(a.step.c);
    float* params = a.step.params + b;
    const G* grads = static_cast<const G*>(a.step.grads) + b;
    std::uint16_t* copy =
        kCopy == kCopyNone ? nullptr : static_cast<std::uint16_t*>(a.step.param_copy) + b;
    std::size_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
        step_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, params, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                                     grads, copy, j);
    }
    if (j == n) return;
    const std::size_t rest = n - j;
    alignas(64) float p[kLanes] = {};
    alignas(64) G g[kLanes] = {};
    alignas(64) std::uint16_t c[kLanes] = {};
    std::memcpy(p, params + j, rest * sizeof(float));
    std::memcpy(g, grads + j, rest * sizeof(G));
    // The moments' buffers already hold whole vectors: the tail updates them in place at j.
    const auto at_j = [j](float* x) { return x == nullptr ? nullptr : x + j; };
    step_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, p, at_j(exp_avg), at_j(exp_avg_sq),
                                                 at_j(max_exp_avg_sq), g, c, 0);
    std::memcpy(params + j, p, rest * sizeof(float));
    if constexpr (kCopy != kCopyNone) std::memcpy(copy + j, c, rest * sizeof(std::uint16_t));
    // The padding lanes must not reach an int8 block's scale.
    for (int m = 0; m < a.moment_count; ++m) {
        std::memset(buffers.moments[m] + n, 0, (round_up_lanes<V>(n) - n) * sizeof(float));
    }
}

template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy, int kState>
void state_step_chunk(const StateStepArgs& a, std::size_t begin, std::size_t end) noexcept {
    StateBlockBuffers buffers;
    for (std::size_t b = begin; b < end; b += kBlock) {
        const std::size_t n = end - b < kBlock ? end - b : kBlock;
        for (int m = 0; m < a.moment_count; ++m) {
            decode_moment_block<V, kState>(a, m, b, n, buffers.moments[m]);
        }
        step_block<V, kKind, kAmsgrad, kGrad, kCopy>(a, b, n, buffers);
        for (int m = 0; m < a.moment_count; ++m) {
            encode_moment_block<V, kState>(a, m, b, n, buffers.moments[m], buffers.words);
        }
    }
}

template <class V, int kState, int kKind, bool kAmsgrad, int kGrad>
constexpr void set_state_entries(StateKernelTable& t) noexcept {
    auto& entries = t.step[kState][kKind][kAmsgrad ? 1 : 0][kGrad];
    entries[kCopyNone] = &state_step_chunk<V, kKind, kAmsgrad, kGrad, kCopyNone, kState>;
    entries[kCopyBf16] = &state_step_chunk<V, kKind, kAmsgrad, kGrad, kCopyBf16, kState>;
    entries[kCopyFp16] = &state_step_chunk<V, kKind, kAmsgrad, kGrad, kCopyFp16, kState>;
}

template <class V, int kState, int kKind, bool kAmsgrad>
constexpr void set_state_kind_entries(StateKernelTable& t) noexcept {
    set_state_entries<V, kState, kKind, kAmsgrad, kGradFp32>(t);
    set_state_entries<V, kState, kKind, kAmsgrad, kGradBf16>(t);
    set_state_entries<V, kState, kKind, kAmsgrad, kGradFp16>(t);
}

template <class V, int kState>
constexpr void set_state_dtype_entries(StateKernelTable& t) noexcept {
    set_state_kind_entries<V, kState, kKindAdam, false>(t);
    set_state_kind_entries<V, kState, kKindAdamW, false>(t);
    set_state_kind_entries<V, kState, kKindAdagrad, false>(t);
    set_state_kind_entries<V, kState, kKindLion, false>(t);
    set_state_kind_entries<V, kState, kKindAdam, true>(t);
    set_state_kind_entries<V, kState, kKindAdamW, true>(t);
}

template <class V>
constexpr StateKernelTable make_state_kernel_table() noexcept {
    StateKernelTable t{};
    set_state_dtype_entries<V, kStateBf16>(t);
    set_state_dtype_entries<V, kStateInt8>(t);
    return t;
}

}  // namespace zinf::kernels::detail
