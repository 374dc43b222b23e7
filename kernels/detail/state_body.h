// Private: the optimizer step over compressed moments (bf16 with stochastic rounding, int8
// blockwise), written once over a vector-operations type V and instantiated by each
// optimizer_states_<isa>.cc unit with its own V (the same rules as optimizer_body.h: only
// templates here, no non-template inline functions, no standard-library algorithms).
//
// Every element runs update_lanes (the fp32 step's element code) on its decoded moments, in
// registers, in the same pass that reads and writes memory, so that the loads of the next
// elements overlap the arithmetic. bf16: one pass, each vector's rounding words hashed from its
// global indices as it is rounded. int8 (blocks of 2048 elements, kStateBlockNumel, of the global
// flat index): pass 1 decodes, updates and writes the new fp32 moments to a 24 KiB buffer (L1)
// while keeping their largest magnitude; pass 2 encodes the buffer with that scale, rounding
// stochastically with the same rounding words (kernels/state_codec.h's encode_int8_stochastic).
//
// V adds to optimizer_body.h's operations: U (the running-maximum vector) with
// max_magnitude_zero(), max_magnitude(acc, x), max_of_magnitudes(acc, |x|) and
// reduce_max_magnitude(acc) (the largest |x|, a NaN anywhere as the quiet NaN 0x7fc00000: the
// same bits in every variant), magnitude(x) (|x|, the sign bit cleared); W (a vector of 32-bit
// words) and rounding_words(run_key, index_low) (state_codec.h's rounding_word of the lanes'
// indices index_low, index_low + 1, ...), and for an int8 block's vectors R with
// rounding_base(run_key, index_low) and rounding_words_at<k>(base) (rounding_words(run_key,
// index_low + k * kLanes), index_low a multiple of 4 * kLanes); load_int8<kUnsigned>(codes, scale)
// (decode_int8), store_int8<kUnsigned, kShift>(codes, x, inv_scale, words) (encode_int8_stochastic
// with each lane's word >> kShift) and store_int8_x4<kUnsigned, kShift>(codes, x, inv_scale, words)
// (four vectors from x and four word vectors; unsigned: x holds magnitudes);
// store_bf16_stochastic<kShift>(dst, x, words) (float_to_bf16_stochastic with word >> kShift) and
// store_bf16_stochastic_pair(dst0, dst1, x0, x1, words) (x0 with the words' low, x1 with their
// high 16 bits). Its fmadd must be fused (the scalar unit uses std::fma), so that every variant
// gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/detail/optimizer_body.h"
#include "kernels/detail/state_table.h"
#include "kernels/state_codec.h"
#include "src/base/assert.h"

namespace zinf::kernels::detail {

// Elements per run: the unit of the prefetches, of the unrolled loops and of an int8 encode
// slice (a multiple of four AVX-512 vectors).
inline constexpr std::size_t kRoundingBatch = 64;
inline constexpr std::size_t kBlock = kStateBlockNumel;
static_assert(kBlock % kRoundingBatch == 0);

// ---- Which moment sits where ----

// The moments a built-in kind keeps (StateStepArgs::moment_count): Adam and AdamW exp_avg,
// exp_avg_sq (and max_exp_avg_sq with amsgrad), Adagrad its sum, Lion exp_avg.
template <int kKind, bool kAmsgrad>
inline constexpr int kKeptMoments = kKind == kKindAdagrad || kKind == kKindLion
                                        ? 1
                                        : (kAmsgrad ? 3 : 2);

// The unsigned (never negative) moments as a bit mask: everything but exp_avg. It is what the
// descriptors' non_negative say (StateStepArgs::unsigned_mask, asserted per chunk), made a
// constant so that the codes are chosen at compile time.
template <int kKind, bool kAmsgrad>
inline constexpr std::uint32_t kUnsignedMask = kKind == kKindAdagrad ? 1u
                                               : kKind == kKindLion  ? 0u
                                                                     : (kAmsgrad ? 6u : 2u);

// Slot s's register among LaneValues (MomentSlots' order).
template <class V, int kKind, int kSlot>
[[gnu::always_inline]] inline typename V::F& slot_value(LaneValues<V>& x) noexcept {
    if constexpr (kKind == kKindAdagrad) return x.v;
    if constexpr (kKind != kKindAdagrad && kSlot == 0) return x.m;
    if constexpr (kKind != kKindAdagrad && kSlot == 1) return x.v;
    if constexpr (kKind != kKindAdagrad && kSlot == 2) return x.v_max;
}

// f(std::integral_constant<int, s>) for s = 0 .. kCount - 1.
template <int kCount, class Fn>
[[gnu::always_inline]] inline void for_slots(Fn&& f) noexcept {
    [&]<int... kSlots>(std::integer_sequence<int, kSlots...>) {
        (f(std::integral_constant<int, kSlots>{}), ...);
    }
    (std::make_integer_sequence<int, kCount>{});
}

// Where a run of elements lives: the step's arrays, or the zero-padded copies of a tail.
struct StateLanePointers {
    float* params;
    const void* grads;
    void* copy;
    void* stored[kStepMoments];  // uint16_t bf16 bits or uint8_t int8 codes
};

template <class V>
StateLanePointers lane_pointers(const StateStepArgs& a) noexcept {
    return {
        a.step.params, a.step.grads, a.step.param_copy, {a.stored[0], a.stored[1], a.stored[2]}};
}

// The last n < kLanes elements of a run, from element j, copied into zero-padded lanes and back:
// every element sees the same vector code wherever it sits.
template <class V, int kGrad, int kCopy>
struct TailLanes {
    static constexpr std::size_t kLanes = V::kLanes;
    alignas(64) float params[kLanes] = {};
    alignas(64) float grads[kLanes] = {};  // fp32, or 16-bit elements in the first half
    alignas(64) std::uint16_t copy[kLanes] = {};
    alignas(64) std::uint16_t stored[kStepMoments][kLanes] = {};

    StateLanePointers pointers() noexcept {
        return {params, grads, copy, {stored[0], stored[1], stored[2]}};
    }
    void load(const StateLanePointers& at, std::size_t j, std::size_t n, std::size_t state_bytes,
              int kept) noexcept {
        using G = typename GradElement<kGrad>::Type;
        std::memcpy(params, at.params + j, n * sizeof(float));
        std::memcpy(grads, static_cast<const G*>(at.grads) + j, n * sizeof(G));
        for (int s = 0; s < kept; ++s) {
            std::memcpy(stored[s], static_cast<const std::byte*>(at.stored[s]) + j * state_bytes,
                        n * state_bytes);
        }
    }
    void store(const StateLanePointers& at, std::size_t j, std::size_t n, std::size_t state_bytes,
               int kept) const noexcept {
        std::memcpy(at.params + j, params, n * sizeof(float));
        if constexpr (kCopy != kCopyNone) {
            std::memcpy(static_cast<std::uint16_t*>(at.copy) + j, copy, n * sizeof(std::uint16_t));
        }
        for (int s = 0; s < kept; ++s) {
            std::memcpy(static_cast<std::byte*>(at.stored[s]) + j * state_bytes, stored[s],
                        n * state_bytes);
        }
    }
};

// Software prefetch, kPrefetchAhead{Bf16,Int8} elements ahead of the 64 elements from i, of every
// array a step reads or writes. The arithmetic between two elements' loads is long (decode, Philox,
// encode), so out-of-order execution alone keeps too few cache misses in flight, and the
// hardware streamers restart at every 4 KiB page; a prefetch never faults, so reading past the
// end of a span is harmless. The distances were measured (64M params, 2 threads): bf16 1024
// (512 and 2048 slower); int8 512 (3 % faster than 1024 on AVX-512, 256 5 % slower).
inline constexpr std::size_t kPrefetchAheadBf16 = 1024;
inline constexpr std::size_t kPrefetchAheadInt8 = 512;

template <int kGrad, int kCopy>
[[gnu::always_inline]] inline void prefetch_run(const StateLanePointers& at, std::size_t i,
                                                std::size_t state_bytes, int kept) noexcept {
    using G = typename GradElement<kGrad>::Type;
    constexpr std::size_t kLine = 64;
    constexpr std::size_t kRun = kRoundingBatch;
    const std::size_t j = i + (state_bytes == 1 ? kPrefetchAheadInt8 : kPrefetchAheadBf16);
    for (std::size_t b = 0; b < kRun * sizeof(float); b += kLine) {
        __builtin_prefetch(reinterpret_cast<const char*>(at.params + j) + b, 1);
    }
    for (std::size_t b = 0; b < kRun * sizeof(G); b += kLine) {
        __builtin_prefetch(reinterpret_cast<const char*>(static_cast<const G*>(at.grads) + j) + b);
    }
    for (int s = 0; s < kept; ++s) {
        const char* stored = static_cast<const char*>(at.stored[s]) + j * state_bytes;
        for (std::size_t b = 0; b < kRun * state_bytes; b += kLine)
            __builtin_prefetch(stored + b, 1);
    }
    if constexpr (kCopy != kCopyNone) {
        const char* copy = reinterpret_cast<const char*>(static_cast<std::uint16_t*>(at.copy) + j);
        for (std::size_t b = 0; b < kRun * sizeof(std::uint16_t); b += kLine) {
            __builtin_prefetch(copy + b, 1);
        }
    }
}

// ---- bf16: one pass, the rounding words hashed per vector ----

// The pairs' run keys (rounding_run_key) for the elements whose global index has high word `high`.
template <int kKept>
[[gnu::always_inline]] inline void make_run_keys(const StateStepArgs& a, std::uint32_t high,
                                                 std::uint32_t* keys) noexcept {
    for (int pair = 0; 2 * pair < kKept; ++pair) {
        keys[pair] = rounding_run_key(a.rounding_keys[pair], high);
    }
}

// One vector at element i, whose first lane's global index has low word `index_low`: decode,
// update_lanes, round back with the words of keys[pair].
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
[[gnu::always_inline]] inline void bf16_lanes(const VectorConstants<V>& k,
                                              const StateLanePointers& at, std::size_t i,
                                              const std::uint32_t* keys,
                                              std::uint32_t index_low) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    LaneValues<V> x{};
    x.g = load_grad<V, kGrad>(at.grads, i);
    x.p = V::load(at.params + i);
    for_slots<kKept>([&](auto s) {
        slot_value<V, kKind, s>(x) =
            V::load_bf16(static_cast<const std::uint16_t*>(at.stored[s]) + i);
    });
    update_lanes<V, kKind, kAmsgrad>(k, x);
    // Moments 0 and 1 share their words (the low and the high 16 bits) and one pack.
    if constexpr (kKept >= 2) {
        V::store_bf16_stochastic_pair(static_cast<std::uint16_t*>(at.stored[0]) + i,
                                      static_cast<std::uint16_t*>(at.stored[1]) + i,
                                      slot_value<V, kKind, 0>(x), slot_value<V, kKind, 1>(x),
                                      V::rounding_words(keys[0], index_low));
    }
    if constexpr (kKept % 2 == 1) {
        constexpr int kLast = kKept - 1;
        V::template store_bf16_stochastic<0>(static_cast<std::uint16_t*>(at.stored[kLast]) + i,
                                             slot_value<V, kKind, kLast>(x),
                                             V::rounding_words(keys[kLast / 2], index_low));
    }
    V::store(at.params + i, x.p);
    store_copy<V, kCopy>(at.copy, i, x.p);
}

// The last rest < 64 elements of a chunk, from element i (global index low word index_low).
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void bf16_tail(const VectorConstants<V>& k, const StateLanePointers& at, std::size_t i,
               std::size_t rest, const std::uint32_t* keys, std::uint32_t index_low) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    std::size_t w = 0;
    for (; w + V::kLanes <= rest; w += V::kLanes) {
        bf16_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, at, i + w, keys,
                                                     index_low + static_cast<std::uint32_t>(w));
    }
    if (w == rest) return;
    TailLanes<V, kGrad, kCopy> tail;
    tail.load(at, i + w, rest - w, sizeof(std::uint16_t), kKept);
    bf16_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, tail.pointers(), 0, keys,
                                                 index_low + static_cast<std::uint32_t>(w));
    tail.store(at, i + w, rest - w, sizeof(std::uint16_t), kKept);
}

// Runs of 64 elements (whole vectors, never across a multiple of 2^32 of the global index, where
// the run keys change).
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void bf16_step_chunk(const StateStepArgs& a, std::size_t begin, std::size_t end) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    constexpr std::size_t kVectors = kRoundingBatch / V::kLanes;
    ZINF_ASSERT(a.moment_count == kKept);
    const VectorConstants<V> k(a.step.c);
    const StateLanePointers at = lane_pointers<V>(a);
    std::uint64_t high = (a.first_index + begin) >> 32;
    std::uint32_t keys[2] = {};
    make_run_keys<kKept>(a, static_cast<std::uint32_t>(high), keys);
    for (std::size_t i = begin; i < end; i += kRoundingBatch) {
        const std::uint64_t index = a.first_index + i;
        if ((index >> 32) != high) [[unlikely]] {
            high = index >> 32;
            make_run_keys<kKept>(a, static_cast<std::uint32_t>(high), keys);
        }
        const auto index_low = static_cast<std::uint32_t>(index);
        if (end - i < kRoundingBatch) {
            bf16_tail<V, kKind, kAmsgrad, kGrad, kCopy>(k, at, i, end - i, keys, index_low);
            return;
        }
        prefetch_run<kGrad, kCopy>(at, i, sizeof(std::uint16_t), kKept);
        // Unrolled (GCC kept the loop): the loop's branches go; measured 3-4 % faster.
#pragma GCC unroll 16
        for (std::size_t v = 0; v < kVectors; ++v) {
            const std::size_t w = v * V::kLanes;
            bf16_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, at, i + w, keys,
                                                         index_low + static_cast<std::uint32_t>(w));
        }
    }
}

// ---- int8: per block, decode and update into an L1 buffer, then encode with the new scale ----

// One block's new fp32 moments: 24 KiB of the caller's stack.
struct Int8BlockBuffers {
    alignas(64) float moments[kStepMoments][kBlock];
};

// One vector at element i (block offset o): decode, update_lanes, the new moments into the
// buffers (unsigned moments as |x|) and their magnitudes into the running maxima.
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
[[gnu::always_inline]] inline void int8_lanes(const VectorConstants<V>& k,
                                              const StateLanePointers& at, std::size_t i,
                                              const typename V::F* scales, Int8BlockBuffers& out,
                                              std::size_t o, typename V::U* maxima) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    constexpr std::uint32_t kMask = kUnsignedMask<kKind, kAmsgrad>;
    LaneValues<V> x{};
    x.g = load_grad<V, kGrad>(at.grads, i);
    x.p = V::load(at.params + i);
    for_slots<kKept>([&](auto s) {
        slot_value<V, kKind, s>(x) = V::template load_int8<((kMask >> s) & 1u) != 0>(
            static_cast<const std::uint8_t*>(at.stored[s]) + i, scales[s]);
    });
    update_lanes<V, kKind, kAmsgrad>(k, x);
    for_slots<kKept>([&](auto s) {
        if constexpr (((kMask >> s) & 1u) != 0) {
            // Unsigned: the code drops the sign, so the buffer keeps |x|, made once here for the
            // maximum and spared to the encode.
            const typename V::F magnitude = V::magnitude(slot_value<V, kKind, s>(x));
            V::store(out.moments[s] + o, magnitude);
            maxima[s] = V::max_of_magnitudes(maxima[s], magnitude);
        } else {
            V::store(out.moments[s] + o, slot_value<V, kKind, s>(x));
            maxima[s] = V::max_magnitude(maxima[s], slot_value<V, kKind, s>(x));
        }
    });
    V::store(at.params + i, x.p);
    store_copy<V, kCopy>(at.copy, i, x.p);
}

// A block updated by pass 1 and waiting for its codes: its buffers, the inverses of its new
// scales, where its codes go and what its rounding words need. Pass 1 of the next block encodes
// a whole block piece by piece; a chunk's last block is encoded after its own pass 1.
struct Int8PendingBlock {
    const Int8BlockBuffers* buffers = nullptr;  // null: none pending
    float inv_scales[kStepMoments];
    std::uint8_t* codes[kStepMoments];
    std::uint32_t keys[2];    // the pairs' run keys (rounding_run_key) for the block
    std::uint32_t index_low;  // the low word of the block's first global index
};

// The moments of pair `kPair` (2 * kPair and, where kept, 2 * kPair + 1: the low and the high 16
// bits of the same words) of 4 * kLanes elements from block offset j encoded.
template <class V, int kKind, bool kAmsgrad, int kPair>
[[gnu::always_inline]] inline void int8_encode_pair_x4(const Int8PendingBlock& pending,
                                                       std::size_t j) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    constexpr std::uint32_t kMask = kUnsignedMask<kKind, kAmsgrad>;
    constexpr int kLow = 2 * kPair;
    const typename V::R base =
        V::rounding_base(pending.keys[kPair], pending.index_low + static_cast<std::uint32_t>(j));
    const typename V::W words[4] = {
        V::template rounding_words_at<0>(base), V::template rounding_words_at<1>(base),
        V::template rounding_words_at<2>(base), V::template rounding_words_at<3>(base)};
    V::template store_int8_x4<((kMask >> kLow) & 1u) != 0, 0>(
        pending.codes[kLow] + j, pending.buffers->moments[kLow] + j,
        V::set1(pending.inv_scales[kLow]), words);
    if constexpr (kLow + 1 < kKept) {
        V::template store_int8_x4<((kMask >> (kLow + 1)) & 1u) != 0, 16>(
            pending.codes[kLow + 1] + j, pending.buffers->moments[kLow + 1] + j,
            V::set1(pending.inv_scales[kLow + 1]), words);
    }
}

// One vector of pair kPair's moments at block offset j; n - j of its lanes stored (all when
// n - j >= kLanes).
template <class V, int kKind, bool kAmsgrad, int kPair>
void int8_encode_pair_lanes(const Int8PendingBlock& pending, std::size_t j,
                            std::size_t n) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    constexpr std::uint32_t kMask = kUnsignedMask<kKind, kAmsgrad>;
    constexpr int kLow = 2 * kPair;
    const typename V::W words = V::template rounding_words_at<0>(
        V::rounding_base(pending.keys[kPair], pending.index_low + static_cast<std::uint32_t>(j)));
    auto one = [&](auto slot, auto shift) {
        constexpr int kSlot = decltype(slot)::value;
        constexpr bool kUnsigned = ((kMask >> kSlot) & 1u) != 0;
        const typename V::F x = V::load(pending.buffers->moments[kSlot] + j);
        const typename V::F inv = V::set1(pending.inv_scales[kSlot]);
        if (n - j >= V::kLanes) {
            V::template store_int8<kUnsigned, decltype(shift)::value>(pending.codes[kSlot] + j, x,
                                                                      inv, words);
            return;
        }
        alignas(64) std::uint8_t tail[V::kLanes] = {};
        V::template store_int8<kUnsigned, decltype(shift)::value>(tail, x, inv, words);
        std::memcpy(pending.codes[kSlot] + j, tail, n - j);
    };
    one(std::integral_constant<int, kLow>{}, std::integral_constant<int, 0>{});
    if constexpr (kLow + 1 < kKept) {
        one(std::integral_constant<int, kLow + 1>{}, std::integral_constant<int, 16>{});
    }
}

// Every kept moment of 4 * kLanes elements from block offset j encoded.
template <class V, int kKind, bool kAmsgrad>
[[gnu::always_inline]] inline void int8_encode_x4(const Int8PendingBlock& pending,
                                                  std::size_t j) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    int8_encode_pair_x4<V, kKind, kAmsgrad, 0>(pending, j);
    if constexpr (kKept > 2) int8_encode_pair_x4<V, kKind, kAmsgrad, 1>(pending, j);
}

// Elements o .. o + 64 of the pending block's moments encoded (a whole block: no tail).
template <class V, int kKind, bool kAmsgrad>
[[gnu::always_inline]] inline void int8_encode_run(const Int8PendingBlock& pending,
                                                   std::size_t o) noexcept {
    constexpr std::size_t kStep = 4 * V::kLanes;
    static_assert(kRoundingBatch % kStep == 0);
    for (std::size_t j = o; j < o + kRoundingBatch; j += kStep) {
        int8_encode_x4<V, kKind, kAmsgrad>(pending, j);
    }
}

// Elements from .. n of the pending block encoded (from a multiple of 4 * kLanes; the buffers
// zero past n up to whole vectors), and none pending.
template <class V, int kKind, bool kAmsgrad>
void int8_finish_pending(Int8PendingBlock& pending, std::size_t from,
                         std::size_t n = kBlock) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    constexpr std::size_t kStep = 4 * V::kLanes;
    if (pending.buffers == nullptr) return;
    std::size_t j = from;
    for (; j + kStep <= n; j += kStep) int8_encode_x4<V, kKind, kAmsgrad>(pending, j);
    for (; j < n; j += V::kLanes) {
        int8_encode_pair_lanes<V, kKind, kAmsgrad, 0>(pending, j, n);
        if constexpr (kKept > 2) int8_encode_pair_lanes<V, kKind, kAmsgrad, 1>(pending, j, n);
    }
    pending.buffers = nullptr;
}

// Pass 1 over the block at b (n elements): every element updated, the new moments in `out`
// (zero past n up to whole vectors), the largest magnitudes in `maxima`. `out` holds the pending
// block (if any): each run of 64 elements first encodes the pending block's same 64, then
// overwrites them. Pass 1 waits on the divider (a square root and a division per vector) while
// the encode needs only the other ports, and memory keeps streaming (as a pass of its own the
// encode took a third of the step and moved no memory). No block is pending on return.
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void int8_update_block(const StateStepArgs& a, const VectorConstants<V>& k, std::size_t b,
                       std::size_t n, Int8BlockBuffers& out, typename V::U* maxima,
                       Int8PendingBlock& pending) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    const StateLanePointers at = lane_pointers<V>(a);
    typename V::F scales[kStepMoments];
    for (int s = 0; s < kKept; ++s) {
        scales[s] = V::set1(a.scales[s][b / kBlock]);
        maxima[s] = V::max_magnitude_zero();
    }
    std::size_t o = 0;
    for (; o + kRoundingBatch <= n; o += kRoundingBatch) {
        prefetch_run<kGrad, kCopy>(at, b + o, 1, kKept);
        if (pending.buffers != nullptr) {
            int8_encode_run<V, kKind, kAmsgrad>(pending, o);
        }
        // Unrolled, as bf16_step_chunk's loop: measured 2-3 % faster.
#pragma GCC unroll 16
        for (std::size_t w = o; w < o + kRoundingBatch; w += V::kLanes) {
            int8_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, at, b + w, scales, out, w, maxima);
        }
    }
    int8_finish_pending<V, kKind, kAmsgrad>(pending, o);
    for (; o + V::kLanes <= n; o += V::kLanes) {
        int8_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, at, b + o, scales, out, o, maxima);
    }
    if (o == n) return;
    TailLanes<V, kGrad, kCopy> tail;
    tail.load(at, b + o, n - o, 1, kKept);
    typename V::U unused[kStepMoments];
    int8_lanes<V, kKind, kAmsgrad, kGrad, kCopy>(k, tail.pointers(), 0, scales, out, o, unused);
    tail.store(at, b + o, n - o, 1, kKept);
    // The padding lanes must not reach the block's scale.
    for (int s = 0; s < kKept; ++s) {
        std::memset(out.moments[s] + n, 0, (o + V::kLanes - n) * sizeof(float));
        maxima[s] = V::max_magnitude(maxima[s], V::load(out.moments[s] + o));
    }
}

// Block by block: pass 1 of each block encodes the block before it on the way, in the same
// buffer; the last block is encoded after its pass 1.
template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy>
void int8_step_chunk(const StateStepArgs& a, std::size_t begin, std::size_t end) noexcept {
    constexpr int kKept = kKeptMoments<kKind, kAmsgrad>;
    constexpr std::uint32_t kMask = kUnsignedMask<kKind, kAmsgrad>;
    ZINF_ASSERT(a.moment_count == kKept && a.unsigned_mask == kMask);
    const VectorConstants<V> k(a.step.c);
    Int8BlockBuffers buffers;
    Int8PendingBlock pending;
    typename V::U maxima[kStepMoments];
    for (std::size_t b = begin; b < end; b += kBlock) {
        const std::size_t n = end - b < kBlock ? end - b : kBlock;
        int8_update_block<V, kKind, kAmsgrad, kGrad, kCopy>(a, k, b, n, buffers, maxima, pending);
        for_slots<kKept>([&](auto s) {
            // The largest magnitude, NaN as the one quiet NaN: the same bits in every variant.
            const float scale = V::reduce_max_magnitude(maxima[s]);
            a.scales[s][b / kBlock] = scale;
            // kernels/state_codec.h's int8_inverse_scale: 0 unless the scale is a finite normal.
            pending.inv_scales[s] =
                scale >= 0x1p-126f && scale <= 0x1.fffffep+127f ? 1.0f / scale : 0.0f;
            pending.codes[s] = static_cast<std::uint8_t*>(a.stored[s]) + b;
        });
        const std::uint64_t index = a.first_index + b;
        ZINF_ASSERT(index % kBlock == 0);  // the encode's rounding_base
        make_run_keys<kKept>(a, static_cast<std::uint32_t>(index >> 32), pending.keys);
        pending.index_low = static_cast<std::uint32_t>(index);
        pending.buffers = &buffers;
        if (n < kBlock) {
            // The chunk's last block, partial: encoded now, with its tail.
            int8_finish_pending<V, kKind, kAmsgrad>(pending, 0, n);
            return;
        }
    }
    int8_finish_pending<V, kKind, kAmsgrad>(pending, 0);
}

template <class V, int kKind, bool kAmsgrad, int kGrad, int kCopy, int kState>
void state_step_chunk(const StateStepArgs& a, std::size_t begin, std::size_t end) noexcept {
    if constexpr (kState == kStateBf16) {
        bf16_step_chunk<V, kKind, kAmsgrad, kGrad, kCopy>(a, begin, end);
    } else {
        int8_step_chunk<V, kKind, kAmsgrad, kGrad, kCopy>(a, begin, end);
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
