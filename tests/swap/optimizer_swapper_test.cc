// OptimizerSwapper: the streamed step over NVMe-resident states is bitwise the same as the
// kernel run over the whole arrays in memory, for every pipeline setting and optimizer, and for
// states stored as bf16 and int8 (runs of global flat indices included); speculated steps,
// committed, redone or discarded, are bitwise the steps taken directly.
#include "swap/optimizer_swapper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
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

// Lets every sub-group through at once, noting the order asked in and (with `swapper`) the
// bytes whose reads had been issued at each call; fails at call `fail_at`.
class RecordingGate final : public SubGroupGate {
public:
    Status ready(std::size_t sub_group) override {
        if (calls.size() == fail_at) return Status::busy("gate closed");
        calls.push_back(sub_group);
        if (swapper != nullptr) read_at_call.push_back(swapper->last_step_stats().bytes_read);
        return Status::ok();
    }
    std::vector<std::size_t> calls;
    std::size_t fail_at = SIZE_MAX;
    const OptimizerSwapper* swapper = nullptr;
    std::vector<std::uint64_t> read_at_call;
};

struct Case {
    kernels::OptimizerKind kind;
    bool pipeline_read;
    bool pipeline_write;
    bool bf16;
    StateDType dtype = StateDType::kFp32;
    std::size_t read_ahead = 1;
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
    SCOPED_TRACE(testing::Message()
                 << optimizer_kind_name(c.kind) << " read=" << c.pipeline_read
                 << " write=" << c.pipeline_write << " bf16=" << c.bf16
                 << " states=" << state_dtype_name(c.dtype) << " read_ahead=" << c.read_ahead);
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
    pipelines.read_ahead = c.read_ahead;
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
    oo.read_ahead = c.read_ahead;
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
    // Reading 3 and 6 sub-groups ahead (7 in all): the tickets wrap at other points.
    run_case({K::kAdamW, true, true, false, StateDType::kFp32, 3});
    run_case({K::kAdamW, true, false, true, StateDType::kFp32, 6});
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

// Speculation: every step is first taken with grad_scale 1 into the shadow extents; then,
// as the engine will once the global norm is known, it is committed, rolled back and redone
// with the clipping scale, or discarded (an overflow step). The states end bitwise equal to
// the kernel run over whole arrays with the decided scales, while a speculated step is pending
// the states read back are the old ones, and a failed speculation leaves them unchanged.
void run_speculation_case(StateDType dtype, std::size_t read_ahead = 1) {
    SCOPED_TRACE(testing::Message() << state_dtype_name(dtype) << " read_ahead=" << read_ahead);
    const std::uint64_t seed = zinf::test::seed();
    std::mt19937_64 rng(seed);
    constexpr std::uint64_t kNumel = 40'000;
    constexpr std::uint64_t kSubGroup = 8'192;  // 5 sub-groups, the last one short
    std::vector<float> params(kNumel), grads(kNumel);
    std::vector<std::uint16_t> grads16(kNumel);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& x : params) x = normal(rng);
    for (auto& x : grads) x = normal(rng) * 1e-2f;
    auto kernel = kernels::OptimizerKernel::create(kernels::best_isa(), 2);
    ASSERT_TRUE(kernel.has_value());
    constexpr std::uint64_t kRoundingSeed = 0x5eed;
    // The reference: whole arrays, stored as the store keeps them.
    std::vector<float> ref_p = params;
    RefMoment ref_m(dtype, kNumel), ref_v(dtype, kNumel);
    const std::vector<kernels::StateSegment> segments =
        dtype == StateDType::kFp32 ? std::vector<kernels::StateSegment>{}
                                   : std::vector<kernels::StateSegment>{{0, kNumel, 4096}};
    auto reference_step = [&](const kernels::OptimizerParams& hp) {
        if (dtype == StateDType::kFp32) {
            kernels::OptimizerState ref;
            ref.params = ref_p;
            ref.moments[0] = ref_m.values;
            ref.moments[1] = ref_v.values;
            ASSERT_TRUE(kernel->step(hp, ref, kernels::GradView::fp32(grads)).is_ok());
            return;
        }
        kernels::StoredState ref;
        ref.params = ref_p;
        ref.dtype = dtype;
        ref.rounding_seed = kRoundingSeed;
        ref.moments[0] = ref_m.stored;
        ref.scales[0] = ref_m.scales;
        ref.moments[1] = ref_v.stored;
        ref.scales[1] = ref_v.scales;
        ASSERT_TRUE(
            kernels::step_segments(*kernel, hp, ref, 0, segments, kernels::GradView::fp32(grads))
                .is_ok());
    };

    zinf::test::TempDir dir("opt");
    auto engine = test::make_sim_engine(seed);
    PinnedPoolOptions po;
    OptimizerSwapperOptions pipelines;
    pipelines.read_ahead = read_ahead;
    po.buffer_count = OptimizerSwapper::buffers_needed(pipelines);
    po.buffer_size_bytes = OptimizerSwapper::buffer_size_bytes(
        kSubGroup, kernels::OptimizerKind::kAdamW, false, dtype);
    po.allow_unlocked = true;
    auto pool = PinnedPool::create(po);
    ASSERT_TRUE(pool.has_value());
    ASSERT_TRUE((*pool)->register_with(*engine).is_ok());
    SwapStoreOptions so;
    so.paths = {dir.path()};
    so.name = "optimizer";
    so.copy_on_write = true;
    auto store = SwapStore::create(*engine, so);
    ASSERT_TRUE(store.has_value());
    OptimizerSwapperOptions oo;
    oo.numel = kNumel;
    oo.sub_group_numel = kSubGroup;
    oo.state_dtype = dtype;
    oo.segments = segments;
    oo.rounding_seed = kRoundingSeed;
    oo.read_ahead = read_ahead;
    auto swapper = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_TRUE(swapper.has_value()) << swapper.status().to_string();
    ASSERT_TRUE((*store)->commit().is_ok());
    VectorParams init(params);
    ASSERT_TRUE((*swapper)->initialize(init).is_ok());
    VectorGrads source(grads, grads16, false);
    OptimizerSwapper& sw = **swapper;

    // What the store holds, decoded: the master and both moments of every sub-group.
    auto read_all = [&] {
        std::vector<float> all(3 * kNumel);
        for (std::size_t g = 0; g < sw.sub_group_count(); ++g) {
            const std::uint64_t n = sw.sub_group_numel(g);
            const std::uint64_t off = sw.sub_group_offset_numel(g);
            const std::span<float> moments[2] = {std::span(all.data() + kNumel + off, n),
                                                 std::span(all.data() + 2 * kNumel + off, n)};
            EXPECT_TRUE(sw.read_sub_group(g, std::span(all.data() + off, n), moments).is_ok());
        }
        return all;
    };
    auto reference_all = [&] {
        const OptimizerDescriptor& d = optimizer_descriptor(kernels::OptimizerKind::kAdamW);
        std::vector<float> all(3 * kNumel);
        std::memcpy(all.data(), ref_p.data(), kNumel * 4);
        RefMoment* refs[2] = {&ref_m, &ref_v};
        for (std::size_t i = 0; i < 2; ++i) {
            std::vector<float> values = refs[i]->values;
            if (dtype != StateDType::kFp32) {
                kernels::decode_moment(dtype, d.moments[i].non_negative, refs[i]->stored,
                                       refs[i]->scales, values);
            }
            std::memcpy(all.data() + (i + 1) * kNumel, values.data(), kNumel * 4);
        }
        return all;
    };

    kernels::OptimizerParams hp;
    hp.lr = 1e-2;
    hp.weight_decay = 0.01;
    std::uint64_t updates = 0;
    // What each step turns out to need once its norm is known.
    enum class Outcome { kCommit, kClip, kOverflow };
    for (const Outcome outcome :
         {Outcome::kCommit, Outcome::kClip, Outcome::kOverflow, Outcome::kClip, Outcome::kCommit}) {
        SCOPED_TRACE(static_cast<int>(outcome));
        const std::vector<float> before = read_all();
        hp.step = updates + 1;
        hp.grad_scale = 1.0;
        // As beside backward: the last sub-group first, each let through by the gate.
        std::vector<std::uint32_t> order(sw.sub_group_count());
        for (std::size_t i = 0; i < order.size(); ++i) {
            order[i] = static_cast<std::uint32_t>(order.size() - 1 - i);
        }
        RecordingGate gate;
        gate.swapper = &sw;
        ASSERT_TRUE(sw.speculate(hp, source, order, gate).is_ok());
        EXPECT_EQ(gate.calls, std::vector<std::size_t>(order.begin(), order.end()));
        // When the gate is asked for the i-th sub-group, the reads of those up to i +
        // read_ahead in the order were issued: a deeper read-ahead reads more while the gate
        // waits for gradients.
        ASSERT_EQ(gate.read_at_call.size(), order.size());
        for (std::size_t i = 0; i < order.size(); ++i) {
            std::uint64_t issued = 0;
            for (std::size_t j = 0; j <= i + read_ahead && j < order.size(); ++j) {
                issued += sw.pinned_read_bytes(order[j]);
            }
            EXPECT_EQ(gate.read_at_call[i], issued) << "at the gate of the " << i << "-th";
        }
        EXPECT_TRUE(sw.speculating());
        EXPECT_EQ(read_all(), before);  // the old states stay current until the commit
        switch (outcome) {
            case Outcome::kCommit:
                ASSERT_TRUE(sw.commit_speculation().is_ok());
                reference_step(hp);
                ++updates;
                break;
            case Outcome::kClip:
                sw.discard_speculation();
                EXPECT_EQ(read_all(), before);
                hp.grad_scale = 0.37;
                ASSERT_TRUE(sw.speculate(hp, source).is_ok());
                ASSERT_TRUE(sw.commit_speculation().is_ok());
                reference_step(hp);
                ++updates;
                break;
            case Outcome::kOverflow:
                sw.discard_speculation();
                break;
        }
        EXPECT_FALSE(sw.speculating());
        ASSERT_EQ(read_all(), reference_all());
    }
    EXPECT_EQ(updates, 4u);
    EXPECT_EQ((*pool)->free_count(), (*pool)->buffer_count());
    swapper->reset();
    store->reset();
}

// The step beside backward stopped by its gate part-way (the norm asked for clipping before
// every sub-group was stepped): nothing is kept, every sub-group reads back its old state, and
// an order that is not a permutation is refused before anything is read.
TEST(OptimizerSwapper, GatedSpeculationStoppedPartWayKeepsTheOldStates) {
    const std::uint64_t seed = zinf::test::seed();
    constexpr std::uint64_t kNumel = 20'000;
    constexpr std::uint64_t kSubGroup = 4'096;
    std::vector<float> params(kNumel, 0.5f), grads(kNumel, 0.25f);
    std::vector<std::uint16_t> grads16;
    auto kernel = kernels::OptimizerKernel::create(kernels::Isa::kScalar, 1);
    ASSERT_TRUE(kernel.has_value());
    zinf::test::TempDir dir("opt");
    auto engine = test::make_sim_engine(seed);
    PinnedPoolOptions po;
    po.buffer_count = OptimizerSwapper::buffers_needed(OptimizerSwapperOptions{});
    po.buffer_size_bytes =
        OptimizerSwapper::buffer_size_bytes(kSubGroup, kernels::OptimizerKind::kAdamW);
    po.allow_unlocked = true;
    auto pool = PinnedPool::create(po);
    ASSERT_TRUE((*pool)->register_with(*engine).is_ok());
    SwapStoreOptions so;
    so.paths = {dir.path()};
    so.copy_on_write = true;
    auto store = SwapStore::create(*engine, so);
    ASSERT_TRUE(store.has_value());
    OptimizerSwapperOptions oo;
    oo.numel = kNumel;
    oo.sub_group_numel = kSubGroup;
    auto swapper = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_TRUE(swapper.has_value());
    ASSERT_TRUE((*store)->commit().is_ok());
    VectorParams init(params);
    ASSERT_TRUE((*swapper)->initialize(init).is_ok());
    OptimizerSwapper& sw = **swapper;
    ASSERT_EQ(sw.sub_group_count(), 5u);
    VectorGrads source(grads, grads16, false);
    kernels::OptimizerParams hp;
    hp.lr = 0.1;
    hp.step = 1;
    RecordingGate gate;
    const std::uint32_t duplicate[] = {4, 3, 3, 1, 0};
    const Status refused = sw.speculate(hp, source, duplicate, gate);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
    EXPECT_TRUE(gate.calls.empty());
    EXPECT_EQ(source.calls, 0);
    const std::uint32_t order[] = {4, 3, 2, 1, 0};
    gate.fail_at = 3;  // sub-groups 4, 3 and 2 stepped, then stopped
    const Status stopped = sw.speculate(hp, source, order, gate);
    EXPECT_EQ(stopped.code(), StatusCode::kBusy) << stopped.to_string();
    EXPECT_EQ(source.calls, 3);
    EXPECT_FALSE(sw.speculating());
    for (std::size_t g = 0; g < sw.sub_group_count(); ++g) {
        const std::uint64_t len = sw.sub_group_numel(g);
        std::vector<float> p(len), m(len), v(len);
        const std::span<float> moments[2] = {m, v};
        ASSERT_TRUE(sw.read_sub_group(g, p, moments).is_ok());
        EXPECT_EQ(p, std::vector<float>(len, 0.5f)) << g;
        EXPECT_EQ(m, std::vector<float>(len, 0.f)) << g;
    }
    EXPECT_EQ((*pool)->free_count(), (*pool)->buffer_count());
    swapper->reset();
    store->reset();
}

TEST(OptimizerSwapper, SpeculatedStepsCommitOrRollBackBitwise) {
    run_speculation_case(StateDType::kFp32);
    run_speculation_case(StateDType::kInt8);
    run_speculation_case(StateDType::kFp32, 2);
    run_speculation_case(StateDType::kBf16, 8);  // more than the 5 sub-groups
}

// A fault inside a speculated step: speculate() fails, and every sub-group (those already
// written to their shadows included) reads back the state from before the step; a second
// speculation with the fault gone then commits. Swept over the step's I/O pieces.
TEST(OptimizerSwapper, FailedSpeculationLeavesTheOldStates) {
    const std::uint64_t seed = zinf::test::seed();
    constexpr std::uint64_t kNumel = 20'000;
    constexpr std::uint64_t kSubGroup = 4'096;
    std::vector<float> params(kNumel, 0.5f), grads(kNumel, 0.25f);
    std::vector<std::uint16_t> grads16;
    auto kernel = kernels::OptimizerKernel::create(kernels::Isa::kScalar, 1);
    ASSERT_TRUE(kernel.has_value());
    std::uint64_t failures = 0;
    for (std::uint64_t n = 1; n <= 200; ++n) {
        SCOPED_TRACE(n);
        zinf::test::TempDir dir("opt");
        io::FaultPlan plan;
        plan.seed = seed;
        plan.fail_nth_op = n;
        auto engine = test::make_sim_engine(seed, plan);
        PinnedPoolOptions po;
        po.buffer_count = OptimizerSwapper::buffers_needed(OptimizerSwapperOptions{});
        po.buffer_size_bytes =
            OptimizerSwapper::buffer_size_bytes(kSubGroup, kernels::OptimizerKind::kAdamW);
        po.allow_unlocked = true;
        auto pool = PinnedPool::create(po);
        ASSERT_TRUE((*pool)->register_with(*engine).is_ok());
        SwapStoreOptions so;
        so.paths = {dir.path()};
        so.copy_on_write = true;
        auto store = SwapStore::create(*engine, so);
        ASSERT_TRUE(store.has_value());
        OptimizerSwapperOptions oo;
        oo.numel = kNumel;
        oo.sub_group_numel = kSubGroup;
        auto swapper = OptimizerSwapper::create(**store, **pool, *kernel, oo);
        ASSERT_TRUE(swapper.has_value());
        ASSERT_TRUE((*store)->commit().is_ok());
        VectorParams init(params);
        if (!(*swapper)->initialize(init).is_ok()) {  // the fault hit the set-up
            swapper->reset();
            store->reset();
            continue;
        }
        VectorGrads source(grads, grads16, false);
        kernels::OptimizerParams hp;
        hp.lr = 0.1;
        hp.step = 1;
        const Status s = (*swapper)->speculate(hp, source);
        const std::uint64_t injected = engine->stats().faults_injected;
        if (s.is_ok()) {
            // Past the step's pieces (the fault may yet hit the reads below): done.
            EXPECT_EQ(injected, 0u);
            ASSERT_TRUE((*swapper)->commit_speculation().is_ok());
            swapper->reset();
            store->reset();
            break;
        }
        ++failures;
        EXPECT_EQ(injected, 1u) << s.to_string();
        EXPECT_FALSE((*swapper)->speculating());
        for (std::size_t g = 0; g < (*swapper)->sub_group_count(); ++g) {
            const std::uint64_t len = (*swapper)->sub_group_numel(g);
            std::vector<float> p(len), m(len), v(len);
            const std::span<float> moments[2] = {m, v};
            ASSERT_TRUE((*swapper)->read_sub_group(g, p, moments).is_ok());
            EXPECT_EQ(p, std::vector<float>(len, 0.5f)) << g;
            EXPECT_EQ(m, std::vector<float>(len, 0.f)) << g;
        }
        ASSERT_TRUE((*swapper)->speculate(hp, source).is_ok());
        ASSERT_TRUE((*swapper)->commit_speculation().is_ok());
        std::vector<float> p(kSubGroup), m(kSubGroup), v(kSubGroup);
        const std::span<float> moments[2] = {m, v};
        ASSERT_TRUE((*swapper)->read_sub_group(0, p, moments).is_ok());
        EXPECT_LT(p[0], 0.5f);  // the step happened
        swapper->reset();
        store->reset();
    }
    EXPECT_GE(failures, 10u);  // reads and writes of five sub-groups
}

// Snapshots: the states pinned before two steps read back as they were, from another thread,
// while the steps run; the second step (which would overwrite the pinned extents) waits until
// the sub-groups are released, and ends bitwise where two plain steps end.
TEST(OptimizerSwapper, PinnedStatesStayReadableWhileStepsRun) {
    const std::uint64_t seed = zinf::test::seed();
    constexpr std::uint64_t kNumel = 30'000;
    constexpr std::uint64_t kSubGroup = 8'192;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> params(kNumel), grads(kNumel);
    for (auto& x : params) x = normal(rng);
    for (auto& x : grads) x = normal(rng) * 1e-2f;
    std::vector<std::uint16_t> grads16;
    auto kernel = kernels::OptimizerKernel::create(kernels::best_isa(), 1);
    ASSERT_TRUE(kernel.has_value());
    // Three steps in memory: the state after one (the snapshot) and after three.
    std::vector<float> ref_p = params, ref_m(kNumel), ref_v(kNumel);
    std::vector<float> snap_p, snap_m;
    kernels::OptimizerParams hp;
    hp.lr = 1e-2;
    for (std::uint64_t step = 1; step <= 3; ++step) {
        hp.step = step;
        kernels::OptimizerState ref;
        ref.params = ref_p;
        ref.moments[0] = ref_m;
        ref.moments[1] = ref_v;
        ASSERT_TRUE(kernel->step(hp, ref, kernels::GradView::fp32(grads)).is_ok());
        if (step == 1) {
            snap_p = ref_p;
            snap_m = ref_m;
        }
    }

    zinf::test::TempDir dir("opt");
    auto engine = test::make_sim_engine(seed);
    PinnedPoolOptions po;
    po.buffer_count = OptimizerSwapper::buffers_needed(OptimizerSwapperOptions{});
    po.buffer_size_bytes =
        OptimizerSwapper::buffer_size_bytes(kSubGroup, kernels::OptimizerKind::kAdamW);
    po.allow_unlocked = true;
    auto pool = PinnedPool::create(po);
    ASSERT_TRUE((*pool)->register_with(*engine).is_ok());
    SwapStoreOptions so;
    so.paths = {dir.path()};
    so.copy_on_write = true;
    auto store = SwapStore::create(*engine, so);
    OptimizerSwapperOptions oo;
    oo.numel = kNumel;
    oo.sub_group_numel = kSubGroup;
    auto swapper = OptimizerSwapper::create(**store, **pool, *kernel, oo);
    ASSERT_TRUE(swapper.has_value());
    ASSERT_TRUE((*store)->commit().is_ok());
    OptimizerSwapper& sw = **swapper;
    VectorParams init(params);
    ASSERT_TRUE(sw.initialize(init).is_ok());
    VectorGrads source(grads, grads16, false);
    hp.step = 1;
    ASSERT_TRUE(sw.step(hp, source).is_ok());
    ASSERT_TRUE(sw.pin_states().is_ok());

    // Two more steps on another thread: the first writes the free extents, the second waits.
    std::atomic<bool> done{false};
    Status stepped;
    std::thread steps([&] {
        for (std::uint64_t step = 2; step <= 3 && stepped.is_ok(); ++step) {
            kernels::OptimizerParams p = hp;
            p.step = step;
            stepped = sw.step(p, source);
        }
        done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(done.load());  // the third step cannot pass the pinned sub-group 0
    AlignedBuffer scratch;
    for (std::size_t g = 0; g < sw.sub_group_count(); ++g) {
        const std::uint64_t n = sw.sub_group_numel(g);
        const std::uint64_t off = sw.sub_group_offset_numel(g);
        std::vector<float> p(n), m(n);
        const std::span<float> moments[1] = {m};
        ASSERT_TRUE(sw.read_pinned_sub_group(g, p, moments, scratch).is_ok());
        EXPECT_EQ(std::memcmp(p.data(), snap_p.data() + off, n * 4), 0) << g;
        EXPECT_EQ(std::memcmp(m.data(), snap_m.data() + off, n * 4), 0) << g;
        sw.unpin_sub_group(g);
    }
    steps.join();
    ASSERT_TRUE(stepped.is_ok()) << stepped.to_string();
    EXPECT_GT((*store)->stats().pin_wait_ns, 0u);
    for (std::size_t g = 0; g < sw.sub_group_count(); ++g) {
        const std::uint64_t n = sw.sub_group_numel(g);
        const std::uint64_t off = sw.sub_group_offset_numel(g);
        std::vector<float> p(n), m(n), v(n);
        const std::span<float> moments[2] = {m, v};
        ASSERT_TRUE(sw.read_sub_group(g, p, moments).is_ok());
        EXPECT_EQ(std::memcmp(p.data(), ref_p.data() + off, n * 4), 0) << g;
        EXPECT_EQ(std::memcmp(v.data(), ref_v.data() + off, n * 4), 0) << g;
    }
    swapper->reset();
    store->reset();
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
    // Reading 2 sub-groups ahead needs 4 buffers; a read-ahead of 0 or beyond the bound is
    // refused whatever the pool.
    oo.sub_group_numel = 1000;
    oo.pipeline_read = true;
    oo.pipeline_write = false;
    oo.read_ahead = 2;
    EXPECT_EQ(OptimizerSwapper::buffers_needed(oo), 3u);
    oo.pipeline_write = true;
    EXPECT_EQ(OptimizerSwapper::buffers_needed(oo), 4u);
    for (const std::size_t ahead : {std::size_t{0}, OptimizerSwapper::kMaxReadAhead + 1}) {
        oo.read_ahead = ahead;
        s = OptimizerSwapper::create(**store, **pool, *kernel, oo);
        ASSERT_FALSE(s.has_value());
        EXPECT_NE(s.error().message().find("read_ahead"), std::string::npos)
            << s.error().to_string();
    }
    store->reset();
}

}  // namespace
}  // namespace zinf::swap
