// Private to adam_bound_{avx2,avx512}.cc: the bound loop over a vector-operations type V declared
// in an anonymous namespace there (so that nothing compiled with one unit's -m flags is shared
// with another; see kernels/detail/optimizer_body.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tools/bench/adam_bound.h"

namespace zinf::bench::detail {

template <class V, bool kTwoStates, bool k16BitGrads, bool kCopy>
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
        V::store(a.exp_avg + i, V::fmadd(g, zero, V::load(a.exp_avg + i)));
        if constexpr (kTwoStates)
            V::store(a.exp_avg_sq + i, V::fmadd(g, zero, V::load(a.exp_avg_sq + i)));
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
        a.exp_avg[i] += g * a.zero;
        if constexpr (kTwoStates) a.exp_avg_sq[i] += g * a.zero;
        if constexpr (kCopy) a.copy[i] = static_cast<std::uint16_t>(a.params[i]);
    }
}

template <class V>
void bound_chunk(const BoundArgs& a, std::size_t begin, std::size_t end) noexcept {
    const int key =
        (a.exp_avg_sq != nullptr ? 4 : 0) + (a.grads_16bit ? 2 : 0) + (a.copy != nullptr ? 1 : 0);
    switch (key) {
        case 0:
            return bound_loop<V, false, false, false>(a, begin, end);
        case 1:
            return bound_loop<V, false, false, true>(a, begin, end);
        case 2:
            return bound_loop<V, false, true, false>(a, begin, end);
        case 3:
            return bound_loop<V, false, true, true>(a, begin, end);
        case 4:
            return bound_loop<V, true, false, false>(a, begin, end);
        case 5:
            return bound_loop<V, true, false, true>(a, begin, end);
        case 6:
            return bound_loop<V, true, true, false>(a, begin, end);
        default:
            return bound_loop<V, true, true, true>(a, begin, end);
    }
}

}  // namespace zinf::bench::detail
