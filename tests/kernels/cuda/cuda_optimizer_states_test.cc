// The GPU step over compressed optimizer states (kernels/cuda/optimizer_states.h) against the CPU
// OptimizerKernel's step over the same StoredState: parameters, stored moments, int8 scales and
// 16-bit copies bitwise equal after each of several steps, for bf16 and int8, every built-in
// optimizer, on spans that start at a nonzero global index (one across 2^32) and end in a partial
// block. Label gpu: each test skips itself when no CUDA device is present.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kernels/cast.h"
#include "kernels/cuda/optimizer_states.h"
#include "kernels/optimizer.h"
#include "kernels/state_codec.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/support/test_seed.h"

namespace zinf::kernels::cuda {
namespace {

using test::DeviceArray;

// A value of magnitude 2^u for u uniform in [lo, hi) (so every magnitude in between is as likely
// as any other), negative half the time unless non_negative; 1 in 16 exactly zero and 1 in 16 a
// denormal.
float wide_value(std::mt19937_64& rng, int lo, int hi, bool non_negative) {
    std::uniform_int_distribution<int> kind(0, 15);
    std::uniform_real_distribution<double> exponent(lo, hi);
    std::uniform_int_distribution<std::uint32_t> denormal(1, 0x007fffffu);
    const int k = kind(rng);
    float magnitude = 0.0f;
    if (k == 1) magnitude = std::bit_cast<float>(denormal(rng));
    if (k > 1) magnitude = static_cast<float>(std::exp2(exponent(rng)));
    const bool negative = !non_negative && (rng() & 1u) != 0;
    return negative ? -magnitude : magnitude;
}

// Values of one array, block by block (blocks of the global flat index, counted from the span's
// start, which is a block boundary): block 1 all zero (an int8 scale of 0), block 2 denormals only
// (a denormal scale, whose codes are all 0), block 3 within one octave of 1, the others wide.
std::vector<float> block_values(std::size_t n, std::mt19937_64& rng, int lo, int hi,
                                bool non_negative) {
    std::vector<float> v(n);
    std::uniform_int_distribution<std::uint32_t> denormal(1, 0x007fffffu);
    std::uniform_real_distribution<float> near_one(1.0f, 2.0f);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t block = i / kStateBlockNumel;
        float x = 0.0f;
        if (block == 2) x = std::bit_cast<float>(denormal(rng));
        if (block == 3) x = near_one(rng);
        if (block != 1 && block != 2 && block != 3) x = wide_value(rng, lo, hi, true);
        v[i] = !non_negative && (rng() & 1u) != 0 ? -x : x;
    }
    return v;
}

// The state as the CPU step takes it, and its device copy.
struct HostState {
    StateDType dtype = StateDType::kBf16;
    std::vector<float> params;
    std::array<std::vector<std::byte>, kMaxMoments> moments;
    std::array<std::vector<float>, kMaxMoments> scales;
};

struct DeviceState {
    std::unique_ptr<DeviceArray<float>> params;
    std::array<std::unique_ptr<DeviceArray<std::byte>>, kMaxMoments> moments;
    std::array<std::unique_ptr<DeviceArray<float>>, kMaxMoments> scales;
};

HostState random_state(StateDType dtype, const OptimizerDescriptor& d, std::size_t kept,
                       std::size_t n, std::mt19937_64& rng) {
    HostState s;
    s.dtype = dtype;
    s.params = block_values(n, rng, -20, 8, false);
    for (std::size_t i = 0; i < kept; ++i) {
        const bool non_negative = d.moments[i].non_negative;
        // Second moments are squares: twice the exponent range of the first.
        const std::vector<float> values = non_negative ? block_values(n, rng, -60, 24, true)
                                                       : block_values(n, rng, -30, 12, false);
        s.moments[i].resize(n * state_element_size_bytes(dtype));
        s.scales[i].resize(state_scale_count(dtype, n));
        encode_moment(dtype, non_negative, values, s.moments[i], s.scales[i]);
    }
    return s;
}

DeviceState upload(const HostState& s) {
    DeviceState d;
    d.params = std::make_unique<DeviceArray<float>>(s.params);
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        d.moments[i] = std::make_unique<DeviceArray<std::byte>>(s.moments[i]);
        d.scales[i] = std::make_unique<DeviceArray<float>>(s.scales[i]);
    }
    return d;
}

StoredState host_view(HostState& s, std::uint64_t first_index, std::uint64_t seed) {
    StoredState v;
    v.params = s.params;
    v.dtype = s.dtype;
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        v.moments[i] = s.moments[i];
        v.scales[i] = s.scales[i];
    }
    v.first_index = first_index;
    v.rounding_seed = seed;
    return v;
}

// The same view over device memory: the spans carry device pointers and sizes.
StoredState device_view(DeviceState& d, StateDType dtype, std::uint64_t first_index,
                        std::uint64_t seed) {
    StoredState v;
    v.params = {d.params->get(), d.params->size()};
    v.dtype = dtype;
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        v.moments[i] = {d.moments[i]->get(), d.moments[i]->size()};
        v.scales[i] = {d.scales[i]->get(), d.scales[i]->size()};
    }
    v.first_index = first_index;
    v.rounding_seed = seed;
    return v;
}

// The index of the first element whose bits differ, or -1.
template <typename T>
std::ptrdiff_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
}

// Every array of the device state bitwise equal to the host state's.
void expect_same_state(const HostState& cpu, const DeviceState& gpu, std::size_t kept) {
    const std::vector<float> params = gpu.params->download();
    const std::ptrdiff_t p = first_difference(params, cpu.params);
    ASSERT_EQ(p, -1) << "params differ first at " << p << ": gpu " << params[p] << " (0x"
                     << std::hex << float_bits(params[p]) << "), cpu " << std::dec << cpu.params[p]
                     << " (0x" << std::hex << float_bits(cpu.params[p]) << ")";
    for (std::size_t i = 0; i < kept; ++i) {
        const std::vector<std::byte> stored = gpu.moments[i]->download();
        const std::ptrdiff_t m = first_difference(stored, cpu.moments[i]);
        ASSERT_EQ(m, -1) << "moment " << i << " differs first at byte " << m << ": gpu 0x"
                         << std::hex << static_cast<int>(stored[m]) << ", cpu 0x"
                         << static_cast<int>(cpu.moments[i][m]);
        const std::vector<float> scales = gpu.scales[i]->download();
        const std::ptrdiff_t s = first_difference(scales, cpu.scales[i]);
        ASSERT_EQ(s, -1) << "moment " << i << "'s scale differs first at block " << s << ": gpu 0x"
                         << std::hex << float_bits(scales[s]) << ", cpu 0x"
                         << float_bits(cpu.scales[i][s]);
    }
}

Isa best_isa() {
    if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
    if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
    return Isa::kScalar;
}

struct Case {
    OptimizerKind kind;
    double weight_decay;
    DType grad;
    DType copy;  // kFloat32: no copy
    bool amsgrad = false;
    bool torch_rounding = false;
    bool bias_correction = true;
};

// Every built-in optimizer and each path through Adam's element code (L2 or decoupled decay, no
// decay, AMSGrad, torch's rounding order, no bias correction), with every gradient and copy dtype.
constexpr Case kCases[] = {
    {OptimizerKind::kAdamW, 0.01, DType::kFloat32, DType::kFloat32},
    {OptimizerKind::kAdam, 0.1, DType::kBFloat16, DType::kBFloat16},
    {OptimizerKind::kAdam, 0.0, DType::kFloat16, DType::kFloat16, true},
    {OptimizerKind::kAdamW, 0.01, DType::kFloat32, DType::kBFloat16, true, true},
    {OptimizerKind::kAdam, 0.1, DType::kFloat32, DType::kFloat32, false, true, false},
    {OptimizerKind::kAdagrad, 0.01, DType::kFloat32, DType::kFloat16},
    {OptimizerKind::kAdagrad, 0.0, DType::kBFloat16, DType::kFloat32},
    {OptimizerKind::kLion, 0.1, DType::kFloat32, DType::kBFloat16},
    {OptimizerKind::kLion, 0.0, DType::kFloat16, DType::kFloat32},
};

// (first_index, numel): a nonzero first block and a partial last one; a span across global index
// 2^32 (the rounding words' run key changes there); one element; one whole block.
struct Span {
    std::uint64_t first_index;
    std::size_t numel;
};
constexpr Span kSpans[] = {
    {3 * kStateBlockNumel, 6 * kStateBlockNumel + 777},
    {(std::uint64_t{1} << 32) - 2 * kStateBlockNumel, 4 * kStateBlockNumel + 1},
    {0, 1},
    {kStateBlockNumel, kStateBlockNumel},
};

OptimizerParams params_for(const Case& c, std::uint64_t step) {
    OptimizerParams op;
    op.kind = c.kind;
    op.step = step;
    op.lr = c.kind == OptimizerKind::kLion ? 1e-4 : 3e-3;
    op.beta1 = 0.9;
    op.beta2 = c.kind == OptimizerKind::kLion ? 0.99 : 0.999;
    op.eps = 1e-8;
    op.weight_decay = c.weight_decay;
    op.grad_scale = 0.5;
    op.amsgrad = c.amsgrad;
    op.torch_rounding = c.torch_rounding;
    op.bias_correction = c.bias_correction;
    return op;
}

TEST(CudaOptimizerStatesTest, BitwiseTheCpuStepForBf16AndInt8) {
    ZINF_SKIP_WITHOUT_CUDA();
    const std::uint64_t seed = test::seed();
    SCOPED_TRACE(testing::Message() << "ZINF_TEST_SEED=" << seed);
    std::mt19937_64 rng(seed);
    auto cpu = OptimizerKernel::create(best_isa(), 2);
    ASSERT_TRUE(cpu.has_value()) << cpu.error().to_string();
    for (const StateDType dtype : {StateDType::kBf16, StateDType::kInt8}) {
        for (const Case& c : kCases) {
            for (const Span& span : kSpans) {
                const std::size_t n = span.numel;
                SCOPED_TRACE(testing::Message()
                             << state_dtype_name(dtype) << " " << optimizer_kind_name(c.kind)
                             << " wd " << c.weight_decay << " grad " << dtype_name(c.grad)
                             << " copy " << dtype_name(c.copy) << " amsgrad " << c.amsgrad
                             << " torch_rounding " << c.torch_rounding << " bias_correction "
                             << c.bias_correction << " first_index " << span.first_index
                             << " numel " << n);
                const OptimizerDescriptor& d = optimizer_descriptor(c.kind);
                const std::size_t kept = d.kept_moment_count(c.amsgrad);
                HostState host = random_state(dtype, d, kept, n, rng);
                const std::vector<float> initial_params = host.params;
                DeviceState device = upload(host);
                const std::uint64_t rounding_seed = rng();
                const bool with_copy = c.copy != DType::kFloat32;
                std::vector<std::uint16_t> cpu_copy(with_copy ? n : 0);
                DeviceArray<std::uint16_t> gpu_copy(cpu_copy.size());
                for (std::uint64_t step = 1; step <= 3; ++step) {
                    SCOPED_TRACE(testing::Message() << "step " << step);
                    const OptimizerParams op = params_for(c, step);
                    // Gradients small enough that fp16 holds them (below 2^10), zero in block 1.
                    const std::vector<float> g32 = block_values(n, rng, -30, 10, false);
                    const ParamCopy host_copy = !with_copy ? ParamCopy::none()
                                                : c.copy == DType::kBFloat16
                                                    ? ParamCopy::bf16(cpu_copy)
                                                    : ParamCopy::fp16(cpu_copy);
                    const ParamCopy device_copy =
                        !with_copy ? ParamCopy::none()
                                   : ParamCopy{gpu_copy.get(), gpu_copy.size(), c.copy};
                    const StoredState host_state = host_view(host, span.first_index, rounding_seed);
                    const StoredState device_state =
                        device_view(device, dtype, span.first_index, rounding_seed);
                    if (c.grad == DType::kFloat32) {
                        DeviceArray<float> dg(g32);
                        ASSERT_TRUE(state_step(op, device_state,
                                               GradView{dg.get(), n, DType::kFloat32}, device_copy,
                                               nullptr)
                                        .is_ok());
                        ASSERT_TRUE(
                            cpu->step(op, host_state, GradView::fp32(g32), host_copy).is_ok());
                    } else {
                        std::vector<std::uint16_t> g16(n);
                        for (std::size_t i = 0; i < n; ++i) {
                            g16[i] = c.grad == DType::kBFloat16 ? float_to_bf16(g32[i])
                                                                : float_to_fp16(g32[i]);
                        }
                        DeviceArray<std::uint16_t> dg(g16);
                        ASSERT_TRUE(state_step(op, device_state, GradView{dg.get(), n, c.grad},
                                               device_copy, nullptr)
                                        .is_ok());
                        const GradView view =
                            c.grad == DType::kBFloat16 ? GradView::bf16(g16) : GradView::fp16(g16);
                        ASSERT_TRUE(cpu->step(op, host_state, view, host_copy).is_ok());
                    }
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    ASSERT_NO_FATAL_FAILURE(expect_same_state(host, device, kept));
                    if (with_copy) {
                        const std::vector<std::uint16_t> got = gpu_copy.download();
                        const std::ptrdiff_t i = first_difference(got, cpu_copy);
                        ASSERT_EQ(i, -1) << "16-bit copy differs first at " << i << ": gpu 0x"
                                         << std::hex << got[i] << ", cpu 0x" << cpu_copy[i];
                    }
                }
                // The step did run: equal states could also be two untouched ones. (A single
                // element may legitimately stay: a zero update, or one below its ulp.)
                if (n > 1) {
                    EXPECT_NE(first_difference(host.params, initial_params), -1);
                }
            }
        }
    }
}

// A block with an infinite gradient and one with a NaN: the int8 scales are infinity and the one
// quiet NaN 0x7fc00000, and every code is the CPU's (an infinite scale encodes the block's finite
// values as 0, a NaN scale makes every nonzero code decode as NaN); the parameters and bf16
// moments match bitwise apart from NaN bits (the GPU makes one canonical NaN).
TEST(CudaOptimizerStatesTest, NonFiniteBlocksMatchTheCpuNansAside) {
    ZINF_SKIP_WITHOUT_CUDA();
    const std::uint64_t seed = test::seed();
    SCOPED_TRACE(testing::Message() << "ZINF_TEST_SEED=" << seed);
    std::mt19937_64 rng(seed);
    auto cpu = OptimizerKernel::create(best_isa(), 1);
    ASSERT_TRUE(cpu.has_value()) << cpu.error().to_string();
    const std::size_t n = 3 * kStateBlockNumel - 5;
    const std::uint64_t first_index = kStateBlockNumel;
    for (const StateDType dtype : {StateDType::kBf16, StateDType::kInt8}) {
        SCOPED_TRACE(state_dtype_name(dtype));
        const OptimizerParams op =
            params_for({OptimizerKind::kAdamW, 0.01, DType::kFloat32, DType::kFloat32}, 1);
        const OptimizerDescriptor& d = optimizer_descriptor(op.kind);
        const std::size_t kept = d.kept_moment_count(false);
        HostState host = random_state(dtype, d, kept, n, rng);
        DeviceState device = upload(host);
        std::vector<float> g = block_values(n, rng, -30, 10, false);
        g[17] = std::numeric_limits<float>::infinity();
        // A payload the CPU carries into the new moments: the scale must still be the one NaN.
        g[kStateBlockNumel + 5] = std::bit_cast<float>(0x7fc12345u);
        DeviceArray<float> dg(g);
        ASSERT_TRUE(state_step(op, device_view(device, dtype, first_index, 7),
                               GradView{dg.get(), n, DType::kFloat32}, ParamCopy::none(), nullptr)
                        .is_ok());
        ASSERT_TRUE(
            cpu->step(op, host_view(host, first_index, 7), GradView::fp32(g), ParamCopy::none())
                .is_ok());
        const std::vector<float> params = device.params->download();
        for (std::size_t i = 0; i < n; ++i) {
            if (std::isnan(params[i]) && std::isnan(host.params[i])) continue;
            ASSERT_EQ(float_bits(params[i]), float_bits(host.params[i])) << "params at " << i;
        }
        for (std::size_t m = 0; m < kept; ++m) {
            const std::vector<std::byte> stored = device.moments[m]->download();
            if (dtype == StateDType::kInt8) {
                EXPECT_EQ(first_difference(stored, host.moments[m]), -1) << "moment " << m;
                const std::vector<float> scales = device.scales[m]->download();
                EXPECT_EQ(first_difference(scales, host.scales[m]), -1) << "moment " << m;
                EXPECT_TRUE(std::isinf(scales[0])) << "moment " << m;
                EXPECT_EQ(float_bits(scales[1]), kCanonicalNanBits) << "moment " << m;
                continue;
            }
            for (std::size_t i = 0; i < n; ++i) {
                std::uint16_t gpu_bits;
                std::uint16_t cpu_bits;
                std::memcpy(&gpu_bits, stored.data() + 2 * i, 2);
                std::memcpy(&cpu_bits, host.moments[m].data() + 2 * i, 2);
                if (std::isnan(bf16_to_float(gpu_bits)) && std::isnan(bf16_to_float(cpu_bits))) {
                    continue;
                }
                ASSERT_EQ(gpu_bits, cpu_bits) << "moment " << m << " at " << i;
            }
        }
    }
}

// The checks before any launch, which need no GPU.
TEST(CudaOptimizerStatesTest, Fp32MomentsAreNotSupported) {
    StoredState state;  // empty: the dtype is checked first
    state.dtype = StateDType::kFp32;
    const Status status =
        state_step(OptimizerParams{}, state, GradView{}, ParamCopy::none(), nullptr);
    EXPECT_EQ(status.code(), StatusCode::kNotSupported) << status.to_string();
}

TEST(CudaOptimizerStatesTest, OutOfRangeParamsAreInvalidArguments) {
    StoredState state;
    state.dtype = StateDType::kInt8;
    OptimizerParams params;
    params.beta2 = 1.0;
    const Status status = state_step(params, state, GradView{}, ParamCopy::none(), nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
}

}  // namespace
}  // namespace zinf::kernels::cuda
