// Activation checkpoints on NVMe (NvmeActivationStore): a Gpt keeping its block inputs there
// trains bitwise as one keeping them on the device, writes every input once per step and reads
// back all but the two still in its write buffers; a full disk is refused at creation, naming
// the key, before anything is written.
#include "src/engine/activation_store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/model/gpt.h"
#include "src/model/parameter_store.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

struct TrainedRun {
    std::vector<float> losses;
    std::vector<std::vector<float>> grads;
    std::size_t written = 0;
    std::size_t read = 0;
};

model::GptConfig small_gpt() {
    model::GptConfig c;
    c.vocab = 64;
    c.n_layer = 5;
    c.n_head = 2;
    c.d_model = 16;
    c.seq_len = 24;
    c.batch_rows_max = 3;
    c.dropout = 0.1f;
    c.seed = 11;
    return c;
}

TrainedRun train(const model::GptConfig& config, const std::string& nvme_dir) {
    device::CpuDeviceOptions dopt;
    dopt.budget_bytes = std::size_t{256} << 20;
    auto device = std::move(device::CpuDevice::create(dopt)).value();
    auto compute = std::move(device::CpuCompute::create(device.get(), {2})).value();
    std::unique_ptr<model::ActivationStore> store;
    if (config.checkpoint_place == model::CheckpointPlace::kStore) {
        engine::NvmeActivationStoreOptions o;
        o.paths = {nvme_dir};
        o.input_bytes = config.batch_rows_max * config.seq_len * config.d_model * sizeof(float);
        o.input_count = config.n_layer;
        auto made = engine::NvmeActivationStore::create(o, *device);
        ZINF_ASSERT_MSG(made.has_value(), made.status().to_string());
        store = std::move(*made);
    }
    auto gpt = model::Gpt::create(config, *device, std::move(store));
    ZINF_ASSERT_MSG(gpt.has_value(), gpt.status().to_string());
    auto params =
        std::move(model::DeviceParameterStore::create((*gpt)->parameters(), *device, *compute))
            .value();
    ZINF_ASSERT(params->initialize(test::seed(), 0));
    TrainedRun run;
    const std::size_t n = config.batch_rows_max * config.seq_len;
    for (std::uint64_t step = 0; step < 3; ++step) {
        std::mt19937 rng(static_cast<unsigned>(test::seed() + step));
        std::vector<std::int32_t> tokens(n), labels(n);
        for (std::size_t i = 0; i < n; ++i) {
            tokens[i] = static_cast<std::int32_t>(rng() % config.vocab);
            labels[i] = static_cast<std::int32_t>(rng() % config.vocab);
        }
        auto t = std::move(DeviceBuffer::allocate(*device, n * 4, "tokens")).value();
        auto l = std::move(DeviceBuffer::allocate(*device, n * 4, "labels")).value();
        ZINF_ASSERT(device->copy_to_device(t.data(), tokens.data(), n * 4, 0));
        ZINF_ASSERT(device->copy_to_device(l.data(), labels.data(), n * 4, 0));
        ZINF_ASSERT(device->synchronize(0));
        model::Context ctx{*compute, *params, *params};
        ctx.step = step;
        ZINF_ASSERT((*gpt)->forward(ctx, t.data(), l.as<std::int32_t>(), config.batch_rows_max));
        run.losses.push_back((*gpt)->read_loss(0).value());
        ZINF_ASSERT((*gpt)->backward(ctx, 1.0f));
    }
    for (const model::ParameterInfo& info : (*gpt)->parameters().all()) {
        std::vector<float> g(info.numel);
        ZINF_ASSERT(device->copy_to_host(g.data(), params->gradient(info.id), info.numel * 4, 0));
        ZINF_ASSERT(device->synchronize(0));
        run.grads.push_back(std::move(g));
    }
    if (const auto* s = (*gpt)->activation_store()) {
        run.written = s->bytes_written();
        run.read = s->bytes_read();
    }
    return run;
}

TEST(NvmeActivationStore, GptTrainsBitwiseAsOnTheDeviceAndReadsAheadInReverse) {
    test::TempDir dir("activations");
    model::GptConfig config = small_gpt();
    config.checkpoint_activations = true;
    const TrainedRun device = train(config, "");
    config.checkpoint_place = model::CheckpointPlace::kStore;
    const TrainedRun nvme = train(config, dir.file("nvme"));
    ASSERT_EQ(nvme.losses.size(), device.losses.size());
    for (std::size_t i = 0; i < device.losses.size(); ++i) {
        EXPECT_EQ(std::memcmp(&nvme.losses[i], &device.losses[i], sizeof(float)), 0) << i;
    }
    for (std::size_t p = 0; p < device.grads.size(); ++p) {
        ASSERT_EQ(
            std::memcmp(nvme.grads[p].data(), device.grads[p].data(), device.grads[p].size() * 4),
            0)
            << "parameter " << p;
    }
    const std::size_t input = config.batch_rows_max * config.seq_len * config.d_model * 4;
    // Every input written each step; the last two stay in the write buffers and are not read.
    EXPECT_EQ(nvme.written, 3 * config.n_layer * input);
    EXPECT_EQ(nvme.read, 3 * (config.n_layer - 2) * input);
    // The run directory is gone with the store; only the lock file stays.
    for (const auto& e : std::filesystem::directory_iterator(dir.file("nvme"))) {
        EXPECT_EQ(e.path().filename(), "zinfinity-swap.lock") << e.path();
    }
}

TEST(NvmeActivationStore, AFullDiskIsRefusedAtCreationNamingTheKey) {
    if (!test::is_root()) GTEST_SKIP() << "needs root to mount a small tmpfs";
    test::TempDir dir("activations");
    const std::string mnt = dir.file("small");
    std::filesystem::create_directories(mnt);
    if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
        GTEST_SKIP() << "mount tmpfs failed: " << std::strerror(errno);
    }
    device::CpuDeviceOptions dopt;
    auto device = std::move(device::CpuDevice::create(dopt)).value();
    engine::NvmeActivationStoreOptions o;
    o.paths = {mnt};
    o.input_bytes = 1 << 20;  // 4 x 1 MiB on 256 KiB
    o.input_count = 4;
    auto store = engine::NvmeActivationStore::create(o, *device);
    ::umount2(mnt.c_str(), MNT_DETACH);
    ASSERT_FALSE(store.has_value());
    EXPECT_EQ(store.error().code(), StatusCode::kNoSpace) << store.error().to_string();
    EXPECT_NE(store.error().message().find("activation_checkpointing.nvme_path"), std::string::npos)
        << store.error().to_string();
}

}  // namespace
}  // namespace zinf
