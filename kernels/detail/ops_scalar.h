// Private: the scalar operations (one element at a time) of the CPU kernels, for any x86-64.
// Include only from units compiled with the baseline flags plus -ffp-contract=off. The struct sits
// in an anonymous namespace, so every unit that includes this header gets its own copy and every
// template instantiated with it stays in that unit (see optimizer_body.h).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cast.h"

namespace zinf::kernels::detail {
namespace {

struct ScalarOps {
    using F = float;
    static constexpr std::size_t kLanes = 1;
    static constexpr int kAccLanes = 1;

    static F load(const float* p) noexcept { return *p; }
    static void store(float* p, F x) noexcept { *p = x; }
    static F load_bf16(const std::uint16_t* p) noexcept { return bf16_to_float(*p); }
    static F load_fp16(const std::uint16_t* p) noexcept { return fp16_to_float(*p); }
    static void store_bf16(std::uint16_t* p, F x) noexcept { *p = float_to_bf16(x); }
    static void store_fp16(std::uint16_t* p, F x) noexcept { *p = float_to_fp16(x); }
    static F set1(float x) noexcept { return x; }
    static F add(F a, F b) noexcept { return a + b; }
    static F mul(F a, F b) noexcept { return a * b; }
    static F div(F a, F b) noexcept { return a / b; }
    static F sqrt(F a) noexcept { return std::sqrt(a); }
    static F fmadd(F a, F b, F c) noexcept { return a * b + c; }  // unfused: see the file comment
    // MAXPS's rule (b unless a > b), with a NaN in a kept: the SIMD variants' max, case by case.
    static F max(F a, F b) noexcept {
        if (a != a) return a;  // NaN
        return a > b ? a : b;
    }
    static F sign(F x) noexcept {
        if (x > 0.0f) return 1.0f;
        if (x < 0.0f) return -1.0f;
        if (x == 0.0f) return 0.0f;
        return x;  // NaN
    }

    using Acc = double;
    static Acc acc_zero() noexcept { return 0.0; }
    static void acc_add_squares(Acc& acc, F x) noexcept {
        const double d = x;
        acc += d * d;  // exact product: the same single rounding as the SIMD variants' FMA
    }
    static double acc_total(const Acc& acc) noexcept { return acc; }
};

}  // namespace
}  // namespace zinf::kernels::detail
