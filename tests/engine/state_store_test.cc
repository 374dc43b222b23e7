// StateStore conformance: one test body over every store — device memory, host memory, NVMe —
// checks that a step is bitwise the in-memory step of the kernel over the whole domain, that
// chunked reads and writes round-trip bitwise, and that a failed read or write surfaces as an
// error naming what failed and leaves the engine refusing to train until a load succeeds.
#include "src/engine/state_store.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/state_codec.h"
#include "src/device/cpu_device.h"
#include "src/engine/offload.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf::engine {
namespace {

using test_support::load_config;
using test_support::small_config;
using test_support::with_nvme;

struct StoreCase {
    const char* name;
    Home home;
    const char* zero;  // spliced into the small config; @NVME@ is the test's directory
    bool amsgrad = false;
    StateDType state_dtype = StateDType::kFp32;  // offload_optimizer.state_dtype
};

const StoreCase kStores[] = {
    {"device", Home::kDevice, R"("zero_optimization": {"stage": 1, "sub_group_size": 1000},)"},
    {"host", Home::kHost,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "cpu"}},)"},
    {"nvme", Home::kNvme,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)"},
    // AMSGrad: a fourth state, the running maximum of exp_avg_sq.
    {"device_amsgrad", Home::kDevice,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000},)", true},
    {"host_amsgrad", Home::kHost,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "cpu"}},)",
     true},
    {"nvme_amsgrad", Home::kNvme,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)",
     true},
    // Compressed moments (src/base/state_dtype.h) in every store.
    {"device_bf16", Home::kDevice, R"("zero_optimization": {"stage": 1, "sub_group_size": 1000},)",
     false, StateDType::kBf16},
    {"host_int8", Home::kHost,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "cpu"}},)",
     false, StateDType::kInt8},
    {"nvme_bf16", Home::kNvme,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)",
     false, StateDType::kBf16},
    {"nvme_int8_amsgrad", Home::kNvme,
     R"("zero_optimization": {"stage": 1, "sub_group_size": 1000,)"
     R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)",
     true, StateDType::kInt8},
};

config::EngineConfig config_of(const StoreCase& c, const std::string& nvme_dir) {
    std::vector<std::string> overrides;
    if (c.amsgrad) overrides.push_back("optimizer.params.amsgrad=true");
    overrides.push_back(str_cat("zero_optimization.offload_optimizer.state_dtype=",
                                state_dtype_name(c.state_dtype)));
    return load_config(with_nvme(small_config(c.zero), nvme_dir), overrides);
}

// The gradient of element i at step s: deterministic, varied in sign and size.
float gradient(std::size_t i, std::uint64_t s) {
    return static_cast<float>(
        std::sin(0.37 * static_cast<double>(i) + 1.3 * static_cast<double>(s)) *
        (0.01 + 0.001 * static_cast<double>(i % 7)));
}

class Gradients final : public swap::GradientSource {
public:
    Gradients(std::size_t numel, std::uint64_t step) : grads_(numel), published_(numel) {
        for (std::size_t i = 0; i < numel; ++i) grads_[i] = gradient(i, step);
    }
    Result<kernels::GradView> gradients(std::size_t, std::uint64_t offset,
                                        std::uint64_t numel) override {
        return kernels::GradView::fp32(
            std::span<const float>(grads_).subspan(offset, static_cast<std::size_t>(numel)));
    }
    Status updated(std::size_t, std::uint64_t offset, std::span<const float> params) override {
        std::copy(params.begin(), params.end(),
                  published_.begin() + static_cast<std::ptrdiff_t>(offset));
        return Status::ok();
    }
    const std::vector<float>& grads() const { return grads_; }
    const std::vector<float>& published() const { return published_; }

private:
    std::vector<float> grads_;
    std::vector<float> published_;
};

class Initial final : public swap::ParamSource {
public:
    Status fill(std::size_t, std::uint64_t offset, std::span<float> out) override {
        for (std::size_t j = 0; j < out.size(); ++j) {
            out[j] = static_cast<float>(std::cos(0.01 * static_cast<double>(offset + j)));
        }
        return Status::ok();
    }
};

// One store with everything it runs on: the plan, a CPU device, the kernel, and the offload
// (swap store, pinned pool, swapper) when the store is on NVMe.
struct Rig {
    explicit Rig(const StoreCase& c, const std::string& nvme_dir) {
        const auto config = config_of(c, nvme_dir);
        PlanInputs in;
        in.parameter_numels = {1500, 700, 40};
        in.device_budget_bytes = 64u << 20;
        auto p = make_offload_plan(config, in);
        ZINF_ASSERT_MSG(p.has_value(), p.error().to_string());
        plan = *p;
        device::CpuDeviceOptions o;
        o.budget_bytes = in.device_budget_bytes;
        device = std::move(device::CpuDevice::create(o)).value();
        kernel = std::make_unique<kernels::OptimizerKernel>(
            std::move(kernels::OptimizerKernel::create(kernels::Isa::kScalar, 1)).value());
        if (plan.needs_io) {
            const Status dirs = check_swap_directories(config);
            ZINF_ASSERT_MSG(dirs.is_ok(), dirs.to_string());
            auto part = std::move(zero::Partitioning::create(in.parameter_numels, 1, 0,
                                                             plan.partition_align_numel))
                            .value();
            auto off = Offload::create(plan, part, *kernel, *device);
            ZINF_ASSERT_MSG(off.has_value(), off.error().to_string());
            offload = std::move(off).value();
        }
        auto s = make_state_store(plan, *device, *kernel, offload ? offload->optimizer() : nullptr);
        ZINF_ASSERT_MSG(s.has_value(), s.error().to_string());
        store = std::move(s).value();
    }

    // Every state, read chunk by chunk: the master and the kept moments in the optimizer
    // descriptor's order.
    struct States {
        std::vector<float> master;
        std::vector<std::vector<float>> moments;
    };
    States read_all() {
        const StateLayout l = store->layout();
        const std::size_t numel = store->numel();
        States out{std::vector<float>(numel),
                   std::vector<std::vector<float>>(l.moment_count, std::vector<float>(numel))};
        for (std::size_t k = 0; k < store->chunk_count(); ++k) {
            const std::size_t at = k * store->chunk_numel(), n = store->chunk_length(k);
            StateChunk c;
            c.master = std::span<float>(out.master).subspan(at, n);
            for (std::size_t i = 0; i < l.moment_count; ++i) {
                c.moments[i] = std::span<float>(out.moments[i]).subspan(at, n);
            }
            const Status s = store->read_chunk(k, c);
            EXPECT_TRUE(s.is_ok()) << s.to_string();
        }
        return out;
    }

    OffloadPlan plan;
    std::unique_ptr<Device> device;
    std::unique_ptr<kernels::OptimizerKernel> kernel;
    std::unique_ptr<Offload> offload;
    std::unique_ptr<StateStore> store;
};

class StateStoreConformance : public ::testing::TestWithParam<StoreCase> {
protected:
    zinf::test::TempDir dir_{"store"};
};

TEST_P(StateStoreConformance, StepsAreBitwiseTheWholeDomainStepOfTheKernel) {
    Rig rig(GetParam(), dir_.path());
    ASSERT_EQ(rig.store->home(), GetParam().home);
    ASSERT_GT(rig.store->chunk_count(), 1u);  // several chunks, the last one short
    Initial initial;
    ASSERT_TRUE(rig.store->initialize(initial));
    // The reference: the same kernel over the whole domain at once (compressed: over the
    // plan's runs of global indices, the moments stored whole and decoded at the end).
    const std::size_t n = rig.store->numel();
    const StateDType dtype = GetParam().state_dtype;
    EXPECT_EQ(rig.store->state_dtype(), dtype);
    EXPECT_EQ(rig.plan.state_segments.empty(), dtype == StateDType::kFp32);
    EXPECT_EQ(rig.store->layout().moment_count, GetParam().amsgrad ? 3u : 2u);
    const std::size_t kept = rig.store->layout().moment_count;
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), vmax(GetParam().amsgrad ? n : 0, 0.0f);
    std::vector<float>* values[3] = {&m, &v, &vmax};
    std::vector<std::byte> stored[3];
    std::vector<float> scales[3];
    for (std::size_t i = 0; i < kept; ++i) {
        stored[i].resize(n * state_element_size_bytes(dtype));
        scales[i].resize(state_scale_count(dtype, n));
    }
    ASSERT_TRUE(initial.fill(0, 0, p));
    for (std::uint64_t s = 1; s <= 3; ++s) {
        kernels::OptimizerParams params = rig.plan.optimizer;
        params.step = s;
        Gradients g(n, s);
        ASSERT_TRUE(rig.store->step(params, g));
        if (dtype == StateDType::kFp32) {
            kernels::OptimizerState state;
            state.params = p;
            state.moments = {std::span<float>(m), std::span<float>(v), std::span<float>(vmax)};
            ASSERT_TRUE(rig.kernel->step(params, state, kernels::GradView::fp32(g.grads())));
        } else {
            kernels::StoredState state;
            state.params = p;
            state.dtype = dtype;
            state.rounding_seed = rig.plan.rounding_seed;
            for (std::size_t i = 0; i < kept; ++i) {
                state.moments[i] = stored[i];
                state.scales[i] = scales[i];
            }
            ASSERT_TRUE(kernels::step_segments(*rig.kernel, params, state, 0,
                                               rig.plan.state_segments,
                                               kernels::GradView::fp32(g.grads())));
        }
        EXPECT_EQ(test_support::bits(g.published()), test_support::bits(p)) << "step " << s;
    }
    if (dtype != StateDType::kFp32) {
        for (std::size_t i = 0; i < kept; ++i) {
            kernels::decode_moment(dtype, rig.store->layout().moment(i).non_negative, stored[i],
                                   scales[i], *values[i]);
        }
        // The moments are stored compressed: they take fewer bytes than fp32 ones.
        EXPECT_LT(rig.store->state_bytes(), (1 + kept) * n * sizeof(float));
    }
    const auto states = rig.read_all();
    EXPECT_EQ(test_support::bits(states.master), test_support::bits(p));
    ASSERT_GE(states.moments.size(), 2u);
    EXPECT_EQ(test_support::bits(states.moments[0]), test_support::bits(m));
    EXPECT_EQ(test_support::bits(states.moments[1]), test_support::bits(v));
    if (GetParam().amsgrad) {
        EXPECT_EQ(test_support::bits(states.moments[2]), test_support::bits(vmax));
    }
}

TEST_P(StateStoreConformance, ChunkedWriteThenReadRoundTripsBitwise) {
    Rig a(GetParam(), dir_.path() + "/a");
    Initial initial;
    ASSERT_TRUE(a.store->initialize(initial));
    for (std::uint64_t s = 1; s <= 2; ++s) {
        kernels::OptimizerParams params = a.plan.optimizer;
        params.step = s;
        Gradients g(a.store->numel(), s);
        ASSERT_TRUE(a.store->step(params, g));
    }
    const auto saved = a.read_all();
    // Into a fresh store (as a checkpoint load does), then one more step on both.
    Rig b(GetParam(), dir_.path() + "/b");
    for (std::size_t k = 0; k < b.store->chunk_count(); ++k) {
        const std::size_t at = k * b.store->chunk_numel(), n = b.store->chunk_length(k);
        ConstStateChunk c;
        c.master = std::span<const float>(saved.master).subspan(at, n);
        for (std::size_t i = 0; i < saved.moments.size(); ++i) {
            c.moments[i] = std::span<const float>(saved.moments[i]).subspan(at, n);
        }
        ASSERT_TRUE(b.store->write_chunk(k, c));
    }
    const auto loaded = b.read_all();
    EXPECT_EQ(test_support::bits(loaded.master), test_support::bits(saved.master));
    ASSERT_EQ(loaded.moments.size(), saved.moments.size());
    for (std::size_t i = 0; i < saved.moments.size(); ++i) {
        EXPECT_EQ(test_support::bits(loaded.moments[i]), test_support::bits(saved.moments[i]));
    }
    kernels::OptimizerParams params = a.plan.optimizer;
    params.step = 3;
    Gradients ga(a.store->numel(), 3), gb(b.store->numel(), 3);
    ASSERT_TRUE(a.store->step(params, ga));
    ASSERT_TRUE(b.store->step(params, gb));
    EXPECT_EQ(test_support::bits(ga.published()), test_support::bits(gb.published()));
}

// Through the engine: a checkpoint load whose read fails part-way (an injected EIO in the
// file system) names the file, and the engine refuses to train until a load succeeds; the next
// (good) load restores it.
TEST_P(StateStoreConformance, FailedLoadNamesTheFileAndTheEngineRefusesUntilALoadSucceeds) {
    const auto config = config_of(GetParam(), dir_.path());
    test::TempDir ckpt("ckpt");
    {
        test_support::Trainer t(config);
        t.run(2);
        ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "good"));
    }
    // The third read call of a load is in the middle of the states (the manifest is first).
    io::FileFaultPlan plan;
    plan.ops = static_cast<std::uint32_t>(io::FileOp::kRead);
    plan.fail_nth_op = 3;
    io::FaultyFileSystem faulty(io::posix_file_system(), plan);
    EngineOptions options;
    options.file_system = &faulty;
    test_support::Trainer t(config, TrainingStack::create(config, options));
    const Status failed = t.engine().load_checkpoint(ckpt.path(), "good");
    ASSERT_FALSE(failed.is_ok());
    EXPECT_EQ(faulty.faults_injected(), 1u);
    EXPECT_NE(failed.message().find(ckpt.path() + "/good/"), std::string::npos)
        << failed.to_string();
    std::vector<float> x(16 * 24, 0.5f);
    std::vector<std::int32_t> y(16, 1);
    auto refused = t.engine().forward(Batch{x, y, 16});
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.error().message().find("load a checkpoint"), std::string::npos);
    ASSERT_TRUE(t.engine().load_checkpoint(ckpt.path(), "good"));
    EXPECT_TRUE(t.engine().forward(Batch{x, y, 16}).has_value());
}

INSTANTIATE_TEST_SUITE_P(AllStores, StateStoreConformance, ::testing::ValuesIn(kStores),
                         [](const auto& store) { return std::string(store.param.name); });

// The NVMe store's own I/O: a read failing during a step names the swap partition, and the
// engine refuses to train until a checkpoint load (which only writes the store) succeeds.
TEST(NvmeStateStore, FailedReadInAStepNamesThePartitionAndTheEngineWaitsForALoad) {
    test::TempDir dir("store");
    const auto config = load_config(with_nvme(small_config(kStores[2].zero), dir.path() + "/a"));
    test::TempDir ckpt("ckpt");
    {
        test_support::Trainer t(config);
        t.run(1);
        ASSERT_TRUE(t.engine().save_checkpoint(ckpt.path(), "good"));
    }
    io::FaultPlan faults;
    faults.read_error_probability = 1.0;  // every read of the store fails; writes succeed
    EngineOptions options;
    options.io_faults = faults;
    const auto config_b = load_config(with_nvme(small_config(kStores[2].zero), dir.path() + "/b"));
    test_support::Trainer t(config_b, TrainingStack::create(config_b, options));
    std::vector<float> x(16 * 24, 0.5f);
    std::vector<std::int32_t> y(16, 1);
    ASSERT_TRUE(t.engine().forward(Batch{x, y, 16}).has_value());
    ASSERT_TRUE(t.engine().backward());
    const Status step = t.engine().step();
    ASSERT_FALSE(step.is_ok());
    EXPECT_NE(step.message().find("partition"), std::string::npos) << step.to_string();
    EXPECT_FALSE(t.engine().forward(Batch{x, y, 16}).has_value());
    ASSERT_TRUE(t.engine().load_checkpoint(ckpt.path(), "good"));
    EXPECT_TRUE(t.engine().forward(Batch{x, y, 16}).has_value());
}

}  // namespace
}  // namespace zinf::engine
