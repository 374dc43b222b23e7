// StoreMover under the ResidencyManager: randomised accesses through tight budgets on the
// simulated device and on real files (every byte read back, budgets held, the store's copies
// valid and exact after a flush); a byte flipped in the swap file is reported as corruption naming
// the partition; an injected ENOSPC at every position of a write-back scenario leaves the
// partition invalid in the store and its newest copy on the host, and loses nothing; bad input.
#include "src/tier/store_mover.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "io/engine.h"
#include "io/fault.h"
#include "src/base/aligned.h"
#include "src/device/cpu_device.h"
#include "src/tier/residency_manager.h"
#include "swap/swap_store.h"
#include "tests/support/test_seed.h"
#include "tests/swap/swap_test_util.h"

namespace zinf::tier {
namespace {

using device::CpuDevice;

// Declared in teardown order: the host region outlives the engine, which outlives the store,
// which outlives the mover, which outlives the manager.
struct Rig {
    zinf::test::TempDir dir{"store-mover"};
    AlignedBuffer region;
    std::unique_ptr<CpuDevice> device;
    std::unique_ptr<io::Engine> engine;
    std::unique_ptr<swap::SwapStore> store;
    std::unique_ptr<StoreMover> mover;
    std::unique_ptr<ResidencyManager> rm;

    // Engine, store and mover; the manager is made by the test.
    Status open(std::unique_ptr<io::Engine> e, std::size_t region_bytes, bool with_device,
                std::size_t max_in_flight = 8, bool urgent = false) {
        ZINF_ASSIGN_OR_RETURN(region, AlignedBuffer::allocate(region_bytes, 4096));
        if (with_device) {
            ZINF_ASSIGN_OR_RETURN(
                device, CpuDevice::create({.budget_bytes = 4 << 20, .worker_thread = true}));
        }
        engine = std::move(e);
        if (engine == nullptr) return Status::internal("no engine");
        swap::SwapStoreOptions options;
        options.paths = {dir.path()};
        options.name = "test";
        ZINF_ASSIGN_OR_RETURN(store, swap::SwapStore::create(*engine, options));
        StoreMoverOptions mover_options;
        mover_options.max_in_flight = max_in_flight;
        mover_options.urgent = urgent;
        ZINF_ASSIGN_OR_RETURN(
            mover, StoreMover::create(*store, device.get(), region.span(), mover_options));
        return Status::ok();
    }
    ~Rig() {
        rm.reset();
        mover.reset();
        store.reset();
        engine.reset();
    }
};

// Writes `bytes` as the partition's copy in the store, through a 4096-aligned staging buffer.
Status write_through_store(swap::SwapStore& store, PartitionId id,
                           const std::vector<std::byte>& bytes) {
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer staging,
                          AlignedBuffer::allocate(align_up(bytes.size(), 4096), 4096));
    std::memcpy(staging.data(), bytes.data(), bytes.size());
    swap::SwapHandle handle;
    ZINF_TRY(store.swap_out(id, staging.span().first(bytes.size()), handle));
    return handle.wait();
}

// Reads the partition's copy back from the store (verifying its checksums).
Status read_through_store(swap::SwapStore& store, PartitionId id, std::vector<std::byte>* out) {
    const std::uint64_t size = store.extent(id).size_bytes;
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer staging,
                          AlignedBuffer::allocate(align_up(size, 4096), 4096));
    swap::SwapHandle handle;
    ZINF_TRY(store.swap_in(id, staging.span(), handle));
    ZINF_TRY(handle.wait());
    out->assign(staging.data(), staging.data() + size);
    return Status::ok();
}

struct Param {
    const char* name;
    bool sim;
};

class StoreMoverRandomised : public ::testing::TestWithParam<Param> {};

// Random acquires and releases of ~40 partitions of awkward sizes through tight device and host
// budgets: every byte read is the last byte written, the budgets hold, and after a flush the
// store holds every partition, valid and exact.
TEST_P(StoreMoverRandomised, ReadsBackEveryByteWithinBudgets) {
    const std::uint64_t seed = zinf::test::seed();
    SCOPED_TRACE(testing::Message() << "ZINF_TEST_SEED=" << seed);
    std::mt19937_64 rng(seed);
    const int count = 36 + static_cast<int>(rng() % 9);
    std::vector<std::size_t> sizes(count);
    std::size_t max_rounded = 0;
    for (auto& s : sizes) {
        // Tiny, page multiples, around the 64 KiB swap block, a few blocks.
        const std::size_t pick[] = {1, 4095, 4096, 4097, 3 * 4096, 65535, 65536, 65537, 150'000};
        s = rng() % 3 == 0 ? pick[rng() % std::size(pick)] : 1 + rng() % 100'000;
        max_rounded = std::max(max_rounded, align_up(s, 4096));
    }
    ResidencyOptions options;
    options.device_budget_bytes = 2 * max_rounded + align_up(rng() % max_rounded, 256);
    options.host_budget_bytes = 3 * max_rounded + align_up(rng() % (2 * max_rounded), 4096);
    options.prefetch_bucket_numel = rng() % (2 * max_rounded);
    options.partition_capacity = static_cast<std::size_t>(count);
    options.check_invariants = true;

    Rig rig;
    auto engine =
        GetParam().sim ? swap::test::make_sim_engine(seed) : swap::test::make_file_engine();
    const Status opened =
        rig.open(std::move(engine), options.host_budget_bytes, true, 1 + rng() % 8);
    ASSERT_TRUE(opened.is_ok()) << opened.to_string();
    auto rm = ResidencyManager::create(options, *rig.mover, rig.device.get());
    ASSERT_TRUE(rm.has_value()) << rm.status().to_string();
    rig.rm = std::move(rm).value();
    ResidencyManager& m = *rig.rm;

    // Register every partition (which reserves it in the store), commit the store, then write
    // the initial contents of those that start on NVMe through the store.
    // Nothing can be written back before the commit: those that start on the host or the device
    // must fit there without evicting each other.
    std::vector<std::vector<std::byte>> shadow(count);
    std::vector<PartitionId> on_nvme;
    std::size_t initial_bytes[2] = {0, 0};
    for (int i = 0; i < count; ++i) {
        const auto id = static_cast<PartitionId>(i);
        Tier initial = i % 9 == 4 ? Tier::kHost : (i % 9 == 7 ? Tier::kDevice : Tier::kNvme);
        if (initial != Tier::kNvme) {
            const int t = static_cast<int>(initial);
            const std::size_t bytes = align_up(sizes[i], 4096);
            const std::size_t budget =
                t == 0 ? options.device_budget_bytes : options.host_budget_bytes;
            if (initial_bytes[t] + bytes <= budget) {
                initial_bytes[t] += bytes;
            } else {
                initial = Tier::kNvme;
            }
        }
        const Status st = m.register_partition(id, sizes[i], DType::kFloat16, initial);
        ASSERT_TRUE(st.is_ok()) << "partition " << i << ": " << st.to_string();
        shadow[i].assign(sizes[i], std::byte{0});
        if (initial == Tier::kNvme) {
            swap::test::fill_random(shadow[i], rng);
            on_nvme.push_back(id);
        }
    }
    ASSERT_TRUE(rig.store->commit().is_ok());
    for (PartitionId id : on_nvme) {
        const Status st = write_through_store(*rig.store, id, shadow[id]);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
    }

    std::vector<Access> pattern;
    for (int i = 0; i < 2 * count; ++i) {
        pattern.push_back({static_cast<PartitionId>(rng() % count),
                           rng() % 4 == 0 ? Tier::kHost : Tier::kDevice});
    }
    auto check_and_maybe_write = [&](PartitionId id, std::byte* data, bool* wrote) {
        ASSERT_NE(data, nullptr);
        ASSERT_EQ(std::memcmp(data, shadow[id].data(), sizes[id]), 0) << "partition " << id;
        *wrote = rng() % 3 == 0;
        if (*wrote) {
            swap::test::fill_random(shadow[id], rng);
            std::memcpy(data, shadow[id].data(), sizes[id]);
        }
    };
    for (int iteration = 0; iteration < 6; ++iteration) {
        std::vector<Access> order = pattern;
        if (rng() % 4 == 0) std::swap(order[rng() % order.size()], order[rng() % order.size()]);
        const bool in_iteration = iteration % 3 != 2;  // some accesses are untraced
        if (in_iteration) m.begin_iteration();
        for (const Access& a : order) {
            auto r = m.acquire(a.id, a.tier);
            ASSERT_TRUE(r.has_value()) << r.status().to_string();
            bool wrote = false;
            ASSERT_NO_FATAL_FAILURE(
                check_and_maybe_write(a.id, static_cast<std::byte*>(*r), &wrote));
            // Sometimes hold a second partition at the same time.
            if (rng() % 4 == 0) {
                const auto other = static_cast<PartitionId>(rng() % count);
                if (other != a.id) {
                    const Tier t = rng() % 2 == 0 ? Tier::kHost : Tier::kDevice;
                    auto r2 = m.acquire(other, t);
                    if (r2.has_value()) {
                        bool wrote2 = false;
                        ASSERT_NO_FATAL_FAILURE(
                            check_and_maybe_write(other, static_cast<std::byte*>(*r2), &wrote2));
                        m.release(other, wrote2);
                    } else {
                        // Two of the largest may not fit the tightest budget at once.
                        ASSERT_EQ(r2.error().code(), StatusCode::kNoSpace)
                            << r2.error().to_string();
                    }
                }
            }
            m.release(a.id, wrote);
            const ResidencyStats s = m.stats();
            ASSERT_LE(s.tiers[0].peak_bytes, options.device_budget_bytes);
            ASSERT_LE(s.tiers[1].peak_bytes, options.host_budget_bytes);
            if (rng() % 5 == 0) {
                ASSERT_TRUE(m.poll().is_ok());
            }
        }
        if (in_iteration) m.end_iteration();
    }
    ASSERT_TRUE(m.flush().is_ok());
    const ResidencyStats s = m.stats();
    EXPECT_EQ(s.failed_moves, 0u);
    EXPECT_GT(s.bytes_swapped_in, 0u);
    EXPECT_GT(s.bytes_swapped_out, 0u);
    EXPECT_LE(s.tiers[0].peak_bytes, options.device_budget_bytes);
    EXPECT_LE(s.tiers[1].peak_bytes, options.host_budget_bytes);
    // The store holds the last bytes written, checksummed.
    const swap::SwapStoreStats store_stats = rig.mover->store().stats();
    EXPECT_EQ(store_stats.corruptions, 0u);
    EXPECT_GT(store_stats.checksum_bytes, 0u);
    EXPECT_GE(store_stats.bytes_swapped_in, s.bytes_swapped_in);
    for (int i = 0; i < count; ++i) {
        const auto id = static_cast<PartitionId>(i);
        ASSERT_TRUE(rig.store->is_valid(id)) << "partition " << i;
        std::vector<std::byte> back;
        const Status st = read_through_store(*rig.store, id, &back);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        ASSERT_EQ(back, shadow[i]) << "partition " << i << " in the store";
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreMoverRandomised,
                         ::testing::Values(Param{"sim", true}, Param{"file", false}),
                         [](const ::testing::TestParamInfo<Param>& param_info) {
                             return std::string(param_info.param.name);
                         });

// A byte flipped in the swap file under a partition that is only on NVMe: the next acquire
// fails with kCorruption naming it; the other partitions still read back. The partitions are
// reserved in the store by the caller, written, and then adopted by the mover at registration.
TEST(StoreMover, FlippedByteInTheSwapFileIsCorruptionNamingThePartition) {
    std::mt19937_64 rng(zinf::test::seed());
    Rig rig;
    const Status opened = rig.open(swap::test::make_file_engine(), 512 * 1024, false);
    ASSERT_TRUE(opened.is_ok()) << opened.to_string();
    constexpr int kCount = 4;
    const std::size_t size = 3 * swap::kSwapBlockBytes + 1234;
    std::vector<std::vector<std::byte>> shadow(kCount);
    for (PartitionId id = 0; id < kCount; ++id)
        ASSERT_TRUE(rig.store->reserve(10 + id, size).is_ok());
    ASSERT_TRUE(rig.store->reserve(20, 4096).is_ok());  // reserved, never written
    ASSERT_TRUE(rig.store->reserve(22, 4096).is_ok());
    ASSERT_TRUE(rig.store->commit().is_ok());
    for (PartitionId id = 0; id < kCount; ++id) {
        shadow[id] = swap::test::random_bytes(size, rng);
        ASSERT_TRUE(write_through_store(*rig.store, 10 + id, shadow[id]).is_ok());
    }
    ResidencyOptions options;
    options.host_budget_bytes = 2 * align_up(size, 4096);
    options.prefetch_bucket_numel = 0;
    options.partition_capacity = 32;
    options.check_invariants = true;
    rig.rm = ResidencyManager::create(options, *rig.mover, nullptr).value();
    for (PartitionId id = 0; id < kCount; ++id) {
        const Status st = rig.rm->register_partition(10 + id, size, DType::kFloat16, Tier::kNvme);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    ASSERT_TRUE(rig.rm->register_partition(20, 4096, DType::kFloat16, Tier::kNvme).is_ok());
    // A size that differs from the store's, an id the store does not hold after commit, an id
    // adopted twice.
    EXPECT_EQ(rig.mover->reserve(22, 5000).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(rig.mover->reserve(21, 4096).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(rig.mover->reserve(20, 4096).code(), StatusCode::kInvalidArgument);

    // Flip one byte in block 2 of partition 12, behind the store's back. The file may be open
    // with O_DIRECT: write through the page cache, push it to disk and drop it from the cache.
    const std::uint64_t flip_at = 2 * swap::kSwapBlockBytes + 99;
    const auto paths = rig.store->data_file_paths();
    ASSERT_EQ(paths.size(), 1u);
    const int fd = ::open(paths[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const auto at = static_cast<off_t>(rig.store->extent(12).file_offset_bytes + flip_at);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ASSERT_EQ(::fsync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);

    auto r = rig.rm->acquire(12, Tier::kHost);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), StatusCode::kCorruption) << r.error().to_string();
    EXPECT_NE(r.error().message().find("partition 12"), std::string::npos) << r.error().message();
    EXPECT_EQ(rig.rm->state(12), PartitionState::kOnNvme);
    EXPECT_EQ(rig.mover->store().stats().corruptions, 1u);
    // Nothing is handed out from a bad read, however often it is asked for.
    EXPECT_EQ(rig.rm->acquire(12, Tier::kHost).status().code(), StatusCode::kCorruption);

    // The store has no valid copy of 20: kNotFound, naming it.
    auto unwritten = rig.rm->acquire(20, Tier::kHost);
    ASSERT_FALSE(unwritten.has_value());
    EXPECT_EQ(unwritten.error().code(), StatusCode::kNotFound) << unwritten.error().to_string();
    EXPECT_NE(unwritten.error().message().find("partition 20"), std::string::npos)
        << unwritten.error().message();

    for (PartitionId id : {10u, 11u, 13u}) {
        auto ok = rig.rm->acquire(id, Tier::kHost);
        ASSERT_TRUE(ok.has_value()) << ok.status().to_string();
        EXPECT_EQ(std::memcmp(*ok, shadow[id - 10].data(), size), 0) << "partition " << id;
        rig.rm->release(id, false);
    }
}

// ENOSPC injected into the n-th I/O piece of a write-back scenario, for every n: a failed
// swap-out surfaces from acquire or flush, leaves the partition invalid in the store with its
// newest copy dirty on the host, and once the fault has passed everything is written and reads
// back.
TEST(StoreMover, EnospcOnWriteBackKeepsTheHostCopyAndLosesNothing) {
    constexpr int kCount = 6;
    constexpr std::size_t kSize = 20'000;  // one swap block, not a page multiple
    int write_back_failures = 0;
    for (std::uint64_t n = 1; n <= 200; ++n) {
        SCOPED_TRACE(testing::Message() << "failing piece " << n << " after setup");
        std::mt19937_64 rng(n);
        // Count the pieces of the setup on a fault-free run of it, so n counts from the scenario.
        Rig rig;
        io::FaultPlan plan;
        plan.errno_to_inject = ENOSPC;
        plan.fail_nth_op = 0;
        {
            Rig probe;
            ASSERT_TRUE(
                probe.open(swap::test::make_sim_engine(n, std::nullopt, 1), 64 * 1024, false)
                    .is_ok());
            for (PartitionId id = 0; id < kCount; ++id)
                ASSERT_TRUE(probe.mover->reserve(id, kSize).is_ok());
            ASSERT_TRUE(probe.store->commit().is_ok());
            for (PartitionId id = 0; id < kCount; ++id) {
                ASSERT_TRUE(
                    write_through_store(*probe.store, id, std::vector<std::byte>(kSize)).is_ok());
            }
            plan.fail_nth_op = probe.engine->stats().pieces_completed + n;
        }
        const Status opened =
            rig.open(swap::test::make_sim_engine(n, plan, 1), 2 * align_up(kSize, 4096), false, 4);
        ASSERT_TRUE(opened.is_ok()) << opened.to_string();
        ResidencyOptions options;
        options.host_budget_bytes = 2 * align_up(kSize, 4096);
        options.prefetch_bucket_numel = 0;
        options.partition_capacity = kCount;
        options.check_invariants = true;
        rig.rm = ResidencyManager::create(options, *rig.mover, nullptr).value();
        ResidencyManager& m = *rig.rm;
        std::vector<std::vector<std::byte>> shadow(kCount);
        for (PartitionId id = 0; id < kCount; ++id)
            ASSERT_TRUE(m.register_partition(id, kSize, DType::kFloat16, Tier::kNvme).is_ok());
        ASSERT_TRUE(rig.store->commit().is_ok());
        for (PartitionId id = 0; id < kCount; ++id) {
            shadow[id] = swap::test::random_bytes(kSize, rng);
            ASSERT_TRUE(write_through_store(*rig.store, id, shadow[id]).is_ok());
        }

        int errors = 0;
        // An error from a write-back: the partition it names is invalid in the store, and its
        // newest copy is still on the host, dirty.
        auto check_failure = [&](const Status& s) {
            ++errors;
            EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.to_string();
            // "... partition <id>: swap out ..." names a failed write-back; else a swap-in failed.
            const std::string& message = s.message();
            const auto at = message.find(": swap out");
            if (at == std::string::npos) return;
            const auto start = message.rfind("partition ", at);
            if (start == std::string::npos) return;
            const std::string digits = message.substr(start + 10, at - start - 10);
            if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
                return;
            ++write_back_failures;
            const auto id = static_cast<PartitionId>(std::stoul(digits));
            ASSERT_LT(id, static_cast<PartitionId>(kCount)) << message;
            EXPECT_FALSE(rig.store->is_valid(id)) << message;
            EXPECT_TRUE(m.is_resident(id, Tier::kHost)) << message;
            EXPECT_EQ(m.state(id), PartitionState::kDirty) << message;
        };
        for (int iteration = 0; iteration < 3; ++iteration) {
            m.begin_iteration();
            for (PartitionId id = 0; id < kCount; ++id) {
                auto r = m.acquire(id, Tier::kHost);
                if (!r.has_value()) {
                    ASSERT_NO_FATAL_FAILURE(check_failure(r.error()));
                    r = m.acquire(id, Tier::kHost);  // the fault has passed
                    ASSERT_TRUE(r.has_value()) << r.error().to_string();
                }
                auto* data = static_cast<std::byte*>(*r);
                ASSERT_EQ(std::memcmp(data, shadow[id].data(), kSize), 0) << "partition " << id;
                swap::test::fill_random(shadow[id], rng);
                std::memcpy(data, shadow[id].data(), kSize);
                m.release(id, /*dirty=*/true);
            }
            m.end_iteration();
        }
        Status flushed = m.flush();
        if (!flushed.is_ok()) {
            ASSERT_NO_FATAL_FAILURE(check_failure(flushed));
            flushed = m.flush();
        }
        ASSERT_TRUE(flushed.is_ok()) << flushed.to_string();
        const std::uint64_t injected = rig.engine->stats().faults_injected;
        EXPECT_EQ(static_cast<std::uint64_t>(errors), injected);  // every fault surfaced, once
        if (injected == 0) break;  // n is past the scenario's last piece: the sweep is complete
        for (PartitionId id = 0; id < kCount; ++id) {
            ASSERT_TRUE(rig.store->is_valid(id)) << "partition " << id;
            std::vector<std::byte> back;
            const Status st = read_through_store(*rig.store, id, &back);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            ASSERT_EQ(back, shadow[id]) << "partition " << id << " in the store";
        }
    }
    // Write-backs are most of the scenario's pieces: several of them must have been hit.
    EXPECT_GE(write_back_failures, 4);
}

// StoreMoverOptions::urgent: the mover's swap-in goes ahead of the store's other operations
// queued before it (the optimizer states' reads and writes beside the parameter tiers); without
// it, it waits behind them. One worker, two 4 KiB pieces in flight, 3 ms each: four 64 KiB
// writes take about 32 rounds.
TEST(StoreMover, UrgentMovesGoAheadOfTheStoresQueuedOperations) {
    for (const bool urgent : {true, false}) {
        SCOPED_TRACE(urgent ? "urgent" : "not urgent");
        io::EngineOptions options;
        options.aio.intra_op_parallelism = 1;
        options.aio.block_size_bytes = 4096;
        options.aio.queue_depth = 2;
        io::SimOptions sim;
        sim.latency_us_min = 3000;
        sim.latency_us_max = 3000;
        options.sim = sim;
        auto engine = io::Engine::create(options);
        ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
        Rig rig;
        ASSERT_TRUE(rig.open(std::move(*engine), 64 * 1024, false, 2, urgent).is_ok());
        ASSERT_TRUE(rig.mover->reserve(0, 4096).is_ok());
        constexpr std::size_t kBulk = 64 * 1024;
        for (PartitionId id = 10; id < 14; ++id) ASSERT_TRUE(rig.store->reserve(id, kBulk).is_ok());
        ASSERT_TRUE(rig.store->commit().is_ok());
        ASSERT_TRUE(
            write_through_store(*rig.store, 0, std::vector<std::byte>(4096, std::byte{7})).is_ok());
        auto bulk_buffer = AlignedBuffer::allocate(4 * kBulk, 4096);
        ASSERT_TRUE(bulk_buffer.has_value());
        std::array<swap::SwapHandle, 4> bulk;
        for (PartitionId i = 0; i < 4; ++i) {
            ASSERT_TRUE(
                rig.store->swap_out(10 + i, bulk_buffer->span().subspan(i * kBulk, kBulk), bulk[i])
                    .is_ok());
        }
        Move in{.kind = MoveKind::kSwapIn, .id = 0, .host = rig.region.data(), .size_bytes = 4096};
        auto token = rig.mover->start(in);
        ASSERT_TRUE(token.has_value()) << token.status().to_string();
        ASSERT_TRUE(rig.mover->wait(*token).is_ok());
        EXPECT_EQ(rig.region.data()[4095], std::byte{7});
        EXPECT_EQ(!bulk.back().done(), urgent);
        for (swap::SwapHandle& h : bulk) ASSERT_TRUE(h.wait().is_ok());
    }
}

TEST(StoreMover, RejectsBadInputAndReportsBusy) {
    Rig rig;
    ASSERT_TRUE(rig.open(swap::test::make_sim_engine(1), 64 * 1024, false, 2).is_ok());
    // An unaligned host region, and no move slots.
    const std::span<std::byte> unaligned = rig.region.span().subspan(512, 8192);
    auto bad = StoreMover::create(*rig.store, nullptr, unaligned, {});
    ASSERT_FALSE(bad.has_value());
    EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument) << bad.error().to_string();
    auto no_slots = StoreMover::create(*rig.store, nullptr, {}, {.max_in_flight = 0});
    ASSERT_FALSE(no_slots.has_value());
    EXPECT_EQ(no_slots.error().code(), StatusCode::kInvalidArgument);

    StoreMover& mover = *rig.mover;
    EXPECT_EQ(mover.host_alignment_bytes(), 4096u);
    EXPECT_EQ(mover.reserve(0, 0).code(), StatusCode::kInvalidArgument);
    for (PartitionId id = 0; id < 3; ++id) ASSERT_TRUE(mover.reserve(id, 5000).is_ok());
    EXPECT_EQ(mover.reserve(1, 5000).code(), StatusCode::kInvalidArgument);  // twice
    std::byte* host = rig.region.data();
    Move out{.kind = MoveKind::kSwapOut, .id = 0, .host = host, .size_bytes = 5000};
    const Result<MoveToken> early = mover.start(out);  // before the store is committed
    ASSERT_FALSE(early.has_value());
    EXPECT_EQ(early.error().code(), StatusCode::kInvalidArgument) << early.error().to_string();
    EXPECT_NE(early.error().message().find("partition 0"), std::string::npos);
    ASSERT_TRUE(rig.store->commit().is_ok());
    EXPECT_EQ(mover.reserve(7, 5000).code(), StatusCode::kInvalidArgument);  // after commit

    // Two slots: a third move is kBusy and starts nothing.
    auto a = mover.start(out);
    ASSERT_TRUE(a.has_value()) << a.status().to_string();
    out.id = 1;
    out.host = host + 8192;
    auto b = mover.start(out);
    ASSERT_TRUE(b.has_value()) << b.status().to_string();
    out.id = 2;
    out.host = host + 16384;
    EXPECT_EQ(mover.start(out).status().code(), StatusCode::kBusy);
    EXPECT_TRUE(mover.wait(*a).is_ok());
    EXPECT_TRUE(mover.wait(*b).is_ok());
    EXPECT_TRUE(rig.store->is_valid(0));
    EXPECT_TRUE(rig.store->is_valid(1));
    EXPECT_FALSE(rig.store->is_valid(2));
    // A swap-in of a partition without a valid copy names it.
    Move in{.kind = MoveKind::kSwapIn, .id = 2, .host = host, .size_bytes = 5000};
    auto missing = mover.start(in);
    ASSERT_FALSE(missing.has_value());
    EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
    EXPECT_NE(missing.error().message().find("partition 2"), std::string::npos);
    // Polling finishes a swap-in (verified).
    in.id = 1;
    auto c = mover.start(in);
    ASSERT_TRUE(c.has_value()) << c.status().to_string();
    Result<bool> done = false;
    for (int i = 0; i < 100'000; ++i) {
        done = mover.poll(*c);
        if (!done.has_value() || *done) break;
        ::usleep(10);
    }
    ASSERT_TRUE(done.has_value()) << done.status().to_string();
    EXPECT_TRUE(*done);
    EXPECT_EQ(mover.store().stats().bytes_swapped_in, 5000u);
}

}  // namespace
}  // namespace zinf::tier
