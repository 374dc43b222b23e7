// EngineMover under the ResidencyManager: on the simulated device (out-of-order completions) and
// on a real file in a temporary directory (O_DIRECT where the file system takes it), with the CPU
// device's worker-thread streams. Streams partitions through tight budgets along a trace, writes
// some, and checks every byte, the budgets and the file contents at the end.
#include "src/tier/engine_mover.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "io/engine.h"
#include "src/base/aligned.h"
#include "src/device/cpu_device.h"
#include "src/tier/residency_manager.h"
#include "tests/support/test_seed.h"

namespace zinf::tier {
namespace {

struct Param {
    const char* name;
    bool sim;
};

class EngineMoverTest : public ::testing::TestWithParam<Param> {};

std::unique_ptr<io::Engine> make_engine(bool sim, std::uint64_t seed) {
    io::EngineOptions options;
    options.aio.block_size_bytes = 64 * 1024;
    options.aio.queue_depth = 8;
    options.aio.intra_op_parallelism = 2;
    if (sim) options.sim = io::SimOptions{.seed = seed, .latency_us_min = 0, .latency_us_max = 200};
    auto engine = io::Engine::create(options);
    EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
    return engine.has_value() ? std::move(engine).value() : nullptr;
}

TEST_P(EngineMoverTest, StreamsAlongTheTraceAndReadsBackEveryByte) {
    const std::uint64_t seed = test::seed();
    std::mt19937_64 rng(seed);
    test::TempDir dir("tier");
    // Declared in teardown order: the host region outlives the engine, which outlives the
    // mover, which outlives the manager.
    AlignedBuffer region = AlignedBuffer::allocate(256 * 1024).value();
    auto device =
        device::CpuDevice::create({.budget_bytes = 1 << 20, .worker_thread = true}).value();
    auto engine = make_engine(GetParam().sim, seed);
    ASSERT_NE(engine, nullptr);
    const int count = 24;
    std::vector<std::size_t> sizes(count);
    std::uint64_t total = 0;
    for (auto& s : sizes) {
        s = 1 + rng() % (40 * 1024);
        total += align_up(s, 4096);
    }
    EngineMoverOptions mover_options;
    mover_options.path = GetParam().sim ? "tier.swap" : dir.file("tier.swap");
    mover_options.capacity_bytes = total;
    mover_options.max_in_flight = 8;
    auto mover = EngineMover::create(*engine, device.get(), region.span(), mover_options);
    ASSERT_TRUE(mover.has_value()) << mover.status().to_string();
    // A second mover on the same path is refused: the file is created exclusively.
    if (!GetParam().sim) {
        EXPECT_FALSE(EngineMover::create(*engine, nullptr, {}, mover_options).has_value());
    }

    ResidencyOptions options;
    options.device_budget_bytes = 160 * 1024;
    options.host_budget_bytes = region.size();
    options.prefetch_bucket_numel = 48 * 1024;  // 96 KiB of fp16 ahead
    options.partition_capacity = count;
    options.check_invariants = true;
    auto rm = ResidencyManager::create(options, **mover, device.get()).value();

    // Register (which reserves each partition's extent), then write the initial contents
    // straight into the file at those extents, before any access.
    std::vector<std::vector<std::byte>> shadow(count);
    AlignedBuffer staging = AlignedBuffer::allocate(64 * 1024).value();
    for (int i = 0; i < count; ++i) {
        const auto id = static_cast<PartitionId>(i);
        ASSERT_TRUE(rm->register_partition(id, sizes[i], DType::kFloat16, Tier::kNvme).is_ok());
        shadow[i].resize(sizes[i]);
        for (auto& b : shadow[i]) b = static_cast<std::byte>(rng());
        std::memset(staging.data(), 0, staging.size());
        std::memcpy(staging.data(), shadow[i].data(), sizes[i]);
        ASSERT_TRUE(engine
                        ->write((*mover)->file(), (*mover)->offset_of(id),
                                staging.span().first(align_up(sizes[i], 4096)))
                        .is_ok());
    }
    std::vector<Access> order;
    for (int i = 0; i < 2 * count; ++i) {
        order.push_back({static_cast<PartitionId>(rng() % count),
                         rng() % 4 == 0 ? Tier::kHost : Tier::kDevice});
    }
    for (int iteration = 0; iteration < 5; ++iteration) {
        rm->begin_iteration();
        for (const Access& a : order) {
            auto r = rm->acquire(a.id, a.tier);
            ASSERT_TRUE(r.has_value()) << r.status().to_string();
            auto* data = static_cast<std::byte*>(*r);
            ASSERT_EQ(std::memcmp(data, shadow[a.id].data(), sizes[a.id]), 0)
                << "partition " << a.id;
            const bool write = rng() % 3 == 0;
            if (write) {
                for (auto& b : shadow[a.id]) b = static_cast<std::byte>(rng());
                std::memcpy(data, shadow[a.id].data(), sizes[a.id]);
            }
            rm->release(a.id, write);
            const ResidencyStats s = rm->stats();
            ASSERT_LE(s.tiers[0].peak_bytes, options.device_budget_bytes);
            ASSERT_LE(s.tiers[1].peak_bytes, options.host_budget_bytes);
        }
        rm->end_iteration();
    }
    const ResidencyStats s = rm->stats();
    EXPECT_EQ(s.trace_changes, 0u);
    EXPECT_GT(s.hits + s.late, 0u);
    EXPECT_GT(s.bytes_swapped_out, 0u);
    ASSERT_TRUE(rm->flush().is_ok());
    // The file now holds the last bytes written.
    for (int i = 0; i < count; ++i) {
        const auto id = static_cast<PartitionId>(i);
        ASSERT_TRUE(engine
                        ->read((*mover)->file(), (*mover)->offset_of(id),
                               staging.span().first(align_up(sizes[i], 4096)))
                        .is_ok());
        ASSERT_EQ(std::memcmp(staging.data(), shadow[i].data(), sizes[i]), 0)
            << "partition " << i << " in the file";
    }
    rm.reset();
    mover->reset();
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineMoverTest,
                         ::testing::Values(Param{"sim", true}, Param{"file", false}),
                         [](const ::testing::TestParamInfo<Param>& param_info) {
                             return std::string(param_info.param.name);
                         });

}  // namespace
}  // namespace zinf::tier
