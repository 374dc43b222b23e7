// OptimizerSwapper: the streamed step over NVMe-resident states is bitwise the same as the
// kernel run over the whole arrays in memory, for every pipeline setting and optimizer, and for
// states stored as bf16 and int8 (runs of global flat indices included).
#include "swap/optimizer_swapper.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/state_codec.h"
#include "tests/support/test_seed.h"
#include "tests/swap/swap_test_util.h"

namespace zinf::swap {
namespace {

class VectorParams final : public ParamSource {
public:
    explicit VectorParams(const std::vector<float>& p) : p_(p) {}
    Status fill(std::size_t, std::uint64_t offset, std::span<float> out) override {
        std::memcpy(out.data(), p_.data() + offset, out.size_bytes());
        return Status::ok();
    }

private:
    const std::vector<float>& p_;
};

class VectorGrads final : public GradientSource {
public:
    VectorGrads(const std::vector<float>& g32, const std::vector<std::uint16_t>& g16, bool bf16)
        : g32_(g32), g16_(g16), bf16_(bf16) {}
    Result<kernels::GradView> gradients(std::size_t, std::uint64_t offset,
                                        std::uint64_t numel) override {
        ++calls;
        if (bf16_) return kernels::GradView::bf16(std::span(g16_.data() + offset, numel));
        return kernels::GradView::fp32(std::span(g32_.data() + offset, numel));
    }
    int calls = 0;

private:
    const std::vector<float>& g32_;
    const std::vector<std::uint16_t>& g16_;
    bool bf16_;
};

struct Case {
    kernels::OptimizerKind kind;
    bool pipeline_read;
    bool pipeline_write;
    bool bf16;
    StateDType dtype = StateDType::kFp32;
};

// The moments of the whole array as the reference keeps them: fp32 values, or the stored
// elements and scales of a compressed dtype.
struct RefMoment {
    std::vector<float> values;
    std::vector<std::byte> stored;
    std::vector<float> scales;
    RefMoment(StateDType dtype, std::size_t numel)
        : values(numel, 0.f),
          stored(numel * state_element_size_bytes(dtype)),
          scales(state_scale_count(dtype, numel)) {}
};

void run_case(const Case& c) {
    SCOPED_TRACE(testing::Message() << optimizer_kind_name(c.kind) << " read=" << c.pipeline_read
                                    << " write=" << c.pipeline_write << " bf16=" << c.bf16
                                    << " states=" << state_dtype_name(c.dtype));
    const std::uint64_t seed = zinf::test::seed();
    std::mt19937_64 rng(seed);
    constexpr std::uint64_t kNumel = 100'003;
    constexpr std::uint64_t kSubGroup = 16'384;  // 7 sub-groups, the last one short
    std::vector<float> params(kNumel), grads(kNumel);
    std::vector<std::uint16_t> grads16(kNumel);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& x : params) x = normal(rng);
    for (std::size_t i = 0; i < kNumel; ++i) {
        grads[i] = normal(rng) * 1e-2f;
        std::uint32_t bits;
        std::memcpy(&bits, &grads[i], 4);
        grads16[i] = static_cast<std::uint16_t>(bits >> 16);
    }

    auto kernel = kernels::OptimizerKernel::create(kernels::best_isa(), 2);
    ASSERT_TRUE(kernel.has_value()) << kernel.status().to_string();

    // The reference: the kernel over whole arrays in memory.
    std::vector<float> ref_p = params;
    RefMoment ref_m(c.dtype, kNumel), ref_v(c.dtype, kNumel);
    // Compressed: two runs of global indices, cut inside the third sub-group, the first far
    // from 0 (as a rank's slices are).
    const std::vector<kernels::StateSegment> segments =
        c.dtype == StateDType::kFp32 ? std::vector<kernels::StateSegment>{}
                                     : std::vector<kernels::StateSegment>{
                                           {0, 40'960, 1u << 20}, {40'960, kNumel - 40'960, 8'192}};
    constexpr std::uint64_t kRoundingSeed = 0x5eed;
    const auto grad_view =
        c.bf16 ? kernels::GradView::bf16(grads16) : kernels::GradView::fp32(grads);
    kernels::OptimizerParams hp;
    hp.kind = c.kind;
    hp.lr = 1e-2;
    hp.weight_decay = 0.01;

    zinf::test::TempDir dir("opt");
    auto engine = test::make_sim_engine(seed);
    PinnedPoolOptions po;
    po.name = "optimizer";
    OptimizerSwapperOptions pipelines;
    pipelines.pipeline_read = c.pipeline_read;
    pipelines.pipeline_write = c.pipeline_write;
    po.buffer_count = OptimizerSwapper::buffers_needed(pipelines);
    po.buffer_size_bytes = OptimizerSwapper::buffer_size_bytes(kSubGroup, c.kind, false, c.dtype);
    po.allow_unlocked = true;
    auto pool = PinnedPool::create(po);
    ASSERT_TRUE(pool.has_value());
    ASSERT_TRUE((*pool)->register_with(*engine).is_ok());
    SwapStoreOptions so;
    so.paths = {dir.path()};
    so.name = "optimizer";
    auto store = SwapStore::create(*engine, so);
    ASSERT_TRUE(store.has_value());
    OptimizerSwapperOptions oo;
    oo.numel = kNumel;
    oo.sub_group_numel = kSubGroup;
    oo.kind = c.kind;
    oo.pipeline_read = c.pipeline_read;
    oo.pipeline_write = c.pipeline_write;
    oo.first_partition = 100;
    oo.state_dtype = c.dtype;
    oo.segments = segments;
    oo.rounding_seed = kRoundingSeed;
    auto swapper = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_TRUE(swapper.has_value()) << swapper.status().to_string();
    ASSERT_TRUE((*store)->commit().is_ok());
    EXPECT_EQ((*swapper)->sub_group_count(), 7u);

    VectorParams init(params);
    ASSERT_TRUE((*swapper)->initialize(init).is_ok());
    VectorGrads source(grads, grads16, c.bf16);
    for (std::uint64_t step = 1; step <= 3; ++step) {
        hp.step = step;
        // The kept moments in the descriptor's order: ref_m, then ref_v.
        const std::size_t kept = optimizer_descriptor(c.kind).kept_moment_count(false);
        if (c.dtype == StateDType::kFp32) {
            kernels::OptimizerState ref;
            ref.params = ref_p;
            if (kept >= 1) ref.moments[0] = ref_m.values;
            if (kept >= 2) ref.moments[1] = ref_v.values;
            ASSERT_TRUE(kernel->step(hp, ref, grad_view).is_ok());
        } else {
            kernels::StoredState ref;
            ref.params = ref_p;
            ref.dtype = c.dtype;
            ref.rounding_seed = kRoundingSeed;
            RefMoment* refs[2] = {&ref_m, &ref_v};
            for (std::size_t i = 0; i < kept; ++i) {
                ref.moments[i] = refs[i]->stored;
                ref.scales[i] = refs[i]->scales;
            }
            ASSERT_TRUE(kernels::step_segments(*kernel, hp, ref, 0, segments, grad_view).is_ok());
        }
        const Status s = (*swapper)->step(hp, source);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    ASSERT_TRUE((*swapper)->io_only_pass().is_ok());  // changes nothing
    EXPECT_EQ(source.calls, 21);
    const OptimizerDescriptor& d = optimizer_descriptor(c.kind);
    if (c.dtype != StateDType::kFp32) {
        RefMoment* refs[2] = {&ref_m, &ref_v};
        for (std::size_t i = 0; i < d.kept_moment_count(false); ++i) {
            kernels::decode_moment(c.dtype, d.moments[i].non_negative, refs[i]->stored,
                                   refs[i]->scales, refs[i]->values);
        }
    }

    for (std::size_t g = 0; g < (*swapper)->sub_group_count(); ++g) {
        const std::uint64_t n = (*swapper)->sub_group_numel(g);
        const std::uint64_t off = (*swapper)->sub_group_offset_numel(g);
        std::vector<float> p(n), m(n), v(n);
        const std::size_t kept = optimizer_descriptor(c.kind).kept_moment_count(false);
        const std::span<float> moments[2] = {m, v};
        ASSERT_TRUE((*swapper)->read_sub_group(g, p, {moments, kept}).is_ok());
        EXPECT_EQ(std::memcmp(p.data(), ref_p.data() + off, n * 4), 0)
            << "params of sub-group " << g;
        EXPECT_EQ(std::memcmp(m.data(), ref_m.values.data() + off, n * 4), 0)
            << "first moment of sub-group " << g;
        if (kept == 2) {
            EXPECT_EQ(std::memcmp(v.data(), ref_v.values.data() + off, n * 4), 0)
                << "second moment of sub-group " << g;
        }
    }
    EXPECT_EQ((*pool)->free_count(), (*pool)->buffer_count());
    swapper->reset();
    store->reset();
}

TEST(OptimizerSwapper, MatchesInMemoryStepBitwise) {
    using K = kernels::OptimizerKind;
    for (const bool r : {false, true}) {
        for (const bool w : {false, true}) run_case({K::kAdamW, r, w, false});
    }
    run_case({K::kAdam, true, true, true});
    run_case({K::kAdagrad, true, false, false});
    run_case({K::kLion, false, true, true});
}

TEST(OptimizerSwapper, CompressedStatesMatchInMemoryStepBitwise) {
    using K = kernels::OptimizerKind;
    for (const StateDType dtype : {StateDType::kBf16, StateDType::kInt8}) {
        run_case({K::kAdamW, true, true, false, dtype});
        run_case({K::kAdam, false, false, true, dtype});
        run_case({K::kAdagrad, true, false, false, dtype});
        run_case({K::kLion, false, true, true, dtype});
    }
}

TEST(OptimizerSwapper, CompressedStatesTakeFewerBytes) {
    // Adam: 12 B per parameter in fp32, 8 in bf16, 6 and the scales in int8.
    const auto bytes = [](StateDType dtype) {
        std::uint64_t b = 0;
        for (std::size_t k = 0; k < 3; ++k) b += OptimizerSwapper::state_bytes(k, 1u << 20, dtype);
        return b;
    };
    EXPECT_EQ(bytes(StateDType::kFp32), 12u << 20);
    EXPECT_EQ(bytes(StateDType::kBf16), 8u << 20);
    EXPECT_EQ(bytes(StateDType::kInt8), (6u << 20) + 2 * 512 * 4);
}

TEST(OptimizerSwapper, CompressedStatesNeedWholeBlocks) {
    zinf::test::TempDir dir("opt");
    auto engine = test::make_sim_engine(1);
    PinnedPoolOptions po;
    po.buffer_count = 3;
    po.buffer_size_bytes = 1 << 20;
    po.allow_unlocked = true;
    auto pool = PinnedPool::create(po);
    SwapStoreOptions so;
    so.paths = {dir.path()};
    auto store = SwapStore::create(*engine, so);
    auto kernel = kernels::OptimizerKernel::create(kernels::Isa::kScalar, 1);
    OptimizerSwapperOptions oo;
    oo.numel = 10'000;
    oo.sub_group_numel = 3'000;  // not a multiple of 2048
    oo.state_dtype = StateDType::kInt8;
    auto s = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_FALSE(s.has_value());
    EXPECT_EQ(s.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.error().message().find("2048"), std::string::npos) << s.error().to_string();
    store->reset();
}

TEST(OptimizerSwapper, TooSmallPoolIsRejected) {
    zinf::test::TempDir dir("opt");
    auto engine = test::make_sim_engine(1);
    PinnedPoolOptions po;
    po.buffer_count = 2;
    po.buffer_size_bytes =
        OptimizerSwapper::buffer_size_bytes(1000, kernels::OptimizerKind::kAdamW);
    po.allow_unlocked = true;
    auto pool = PinnedPool::create(po);
    SwapStoreOptions so;
    so.paths = {dir.path()};
    auto store = SwapStore::create(*engine, so);
    auto kernel = kernels::OptimizerKernel::create(kernels::Isa::kScalar, 1);
    OptimizerSwapperOptions oo;
    oo.numel = 5000;
    oo.sub_group_numel = 1000;  // pipelined both ways: 3 buffers needed
    auto s = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_FALSE(s.has_value());
    EXPECT_EQ(s.error().code(), StatusCode::kInvalidArgument);
    oo.sub_group_numel = 2000;
    oo.pipeline_read = false;
    s = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_FALSE(s.has_value());  // buffers too small
    store->reset();
}

}  // namespace
}  // namespace zinf::swap
