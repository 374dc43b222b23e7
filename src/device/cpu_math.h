// Branch-free fp32 exp and tanh for CpuCompute's elementwise loops (softmax, cross-entropy,
// GELU): written so that the compiler vectorises a loop over them (no calls, no branches, no
// table), unlike the C library's scalar expf/tanhf, which cost more than the GEMMs around them.
//
// exp: Cephes' expf scheme. n = round(x log2 e) by the 1.5 * 2^23 rounding trick, r = x - n ln 2
// in two parts (Cody-Waite), e^r by a degree-7 polynomial on [-ln2/2, ln2/2], times 2^n built in
// the exponent bits. x is clamped to [-87, 88] (no overflow or denormals; e^-87 = 1.6e-38 stands
// for anything smaller, negligible wherever it is summed with a 1). Measured error against
// double: 8.2e-8 relative over the range, under 2 ulp (tests/model/compute_test.cc, CpuMath).
// tanh(u) = 1 - 2 / (e^{2u} + 1), u clamped to [-10, 10] (tanh(10) rounds to 1 in fp32); its
// absolute error is ~1e-7, which is what GELU's 1 + tanh needs.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace zinf::device::cpu_math {

[[gnu::always_inline]] inline float exp(float x) noexcept {
    x = std::min(std::max(x, -87.0f), 88.0f);
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float t = x * 1.44269504088896341f + kRound;
    const float n = t - kRound;
    const std::int32_t ni = std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(kRound);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * r * r + r + 1.0f;
    return e * std::bit_cast<float>((ni + 127) << 23);
}

[[gnu::always_inline]] inline float tanh(float u) noexcept {
    u = std::min(std::max(u, -10.0f), 10.0f);
    return 1.0f - 2.0f / (cpu_math::exp(2.0f * u) + 1.0f);
}

}  // namespace zinf::device::cpu_math
