// Private to adam_bound_{avx2,avx512}.cc: the bound loop over a vector-operations type V declared
// in an anonymous namespace there (so that nothing compiled with one unit's -m flags is shared
// with another; see kernels/detail/optimizer_body.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tools/bench/adam_bound.h"

namespace zinf::bench::detail {

// A moment element of kStateBytes (4 fp32, 2 16-bit, 1 8-bit) widened to fp32 and back: as many
// bytes as the optimizer moves, less work.
template <class V, int kStateBytes>
typename V::F load_state(const void* s, std::size_t i) noexcept {
    if constexpr (kStateBytes == 4) return V::load(static_cast<const float*>(s) + i);
    if constexpr (kStateBytes == 2) return V::load_16bit(static_cast<const std::uint16_t*>(s) + i);
    if constexpr (kStateBytes == 1) return V::load_8bit(static_cast<const std::uint8_t*>(s) + i);
}
template <class V, int kStateBytes>
void store_state(void* s, std::size_t i, typename V::F x) noexcept {
    if constexpr (kStateBytes == 4) V::store(static_cast<float*>(s) + i, x);
    if constexpr (kStateBytes == 2) V::store_16bit(static_cast<std::uint16_t*>(s) + i, x);
    if constexpr (kStateBytes == 1) V::store_8bit(static_cast<std::uint8_t*>(s) + i, x);
}
template <int kStateBytes>
void touch_state_scalar(void* s, std::size_t i, float delta) noexcept {
    if constexpr (kStateBytes == 4) static_cast<float*>(s)[i] += delta;
    if constexpr (kStateBytes == 2) {
        auto* t = static_cast<std::uint16_t*>(s);
        t[i] = static_cast<std::uint16_t>(t[i] + static_cast<std::uint16_t>(delta));
    }
    if constexpr (kStateBytes == 1) {
        auto* t = static_cast<std::uint8_t*>(s);
        t[i] = static_cast<std::uint8_t>(t[i] + static_cast<std::uint8_t>(delta));
    }
}

template <class V, int kStateBytes, bool kTwoStates, bool k16BitGrads, bool kCopy>
void bound_loop(const BoundArgs& a, std::size_t begin, std::size_t end) noexcept {
    using F = typename V::F;
    const F zero = V::set1(a.zero);
    std::size_t i = begin;
    for (; i + V::kLanes <= end; i += V::kLanes) {
        F g;
        if constexpr (k16BitGrads) {
            g = V::load_16bit(static_cast<const std::uint16_t*>(a.grads) + i);
        } else {
            g = V::load(static_cast<const float*>(a.grads) + i);
        }
        const F p = V::fmadd(g, zero, V::load(a.params + i));
        store_state<V, kStateBytes>(a.exp_avg, i,
                                    V::fmadd(g, zero, load_state<V, kStateBytes>(a.exp_avg, i)));
        if constexpr (kTwoStates) {
            store_state<V, kStateBytes>(
                a.exp_avg_sq, i, V::fmadd(g, zero, load_state<V, kStateBytes>(a.exp_avg_sq, i)));
        }
        V::store(a.params + i, p);
        if constexpr (kCopy) V::store_16bit(a.copy + i, p);
    }
    // The tail (only at the very end of the arrays) in plain scalar code: exactness is moot.
    for (; i < end; ++i) {
        float g;
        if constexpr (k16BitGrads) {
            g = static_cast<float>(static_cast<const std::uint16_t*>(a.grads)[i]);
        } else {
            g = static_cast<const float*>(a.grads)[i];
        }
        a.params[i] += g * a.zero;
        touch_state_scalar<kStateBytes>(a.exp_avg, i, g * a.zero);
        if constexpr (kTwoStates) touch_state_scalar<kStateBytes>(a.exp_avg_sq, i, g * a.zero);
        if constexpr (kCopy) a.copy[i] = static_cast<std::uint16_t>(a.params[i]);
    }
}

template <class V, int kStateBytes>
void bound_chunk_for(const BoundArgs& a, std::size_t begin, std::size_t end) noexcept {
    const int key =
        (a.exp_avg_sq != nullptr ? 4 : 0) + (a.grads_16bit ? 2 : 0) + (a.copy != nullptr ? 1 : 0);
    switch (key) {
        case 0:
            return bound_loop<V, kStateBytes, false, false, false>(a, begin, end);
        case 1:
            return bound_loop<V, kStateBytes, false, false, true>(a, begin, end);
        case 2:
            return bound_loop<V, kStateBytes, false, true, false>(a, begin, end);
        case 3:
            return bound_loop<V, kStateBytes, false, true, true>(a, begin, end);
        case 4:
            return bound_loop<V, kStateBytes, true, false, false>(a, begin, end);
        case 5:
            return bound_loop<V, kStateBytes, true, false, true>(a, begin, end);
        case 6:
            return bound_loop<V, kStateBytes, true, true, false>(a, begin, end);
        default:
            return bound_loop<V, kStateBytes, true, true, true>(a, begin, end);
    }
}

template <class V>
void bound_chunk(const BoundArgs& a, std::size_t begin, std::size_t end) noexcept {
    switch (a.state_bytes) {
        case 4:
            return bound_chunk_for<V, 4>(a, begin, end);
        case 2:
            return bound_chunk_for<V, 2>(a, begin, end);
        default:
            return bound_chunk_for<V, 1>(a, begin, end);
    }
}

}  // namespace zinf::bench::detail
