// SwapStore: randomised swap-outs and swap-ins on the simulated device read back every byte
// as written; a flipped byte in a real swap file is reported with partition and offset; ENOSPC
// leaves no partition marked valid that is not; too little space fails before any write.
// Copy-on-write: a shadow write leaves the current copy readable until commit, a discard or a
// failed shadow leaves every partition as it was, and a commit switches all or none.
#include "swap/swap_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "src/base/aligned.h"
#include "tests/support/test_seed.h"
#include "tests/swap/swap_test_util.h"

namespace zinf::swap {
namespace {

struct Fixture {
    zinf::test::TempDir dir{"store"};
    std::unique_ptr<io::Engine> engine;
    std::unique_ptr<SwapStore> store;

    // With paths > 1 the swap file is striped over subdirectories a, b, ... of the temp dir.
    Status open(std::unique_ptr<io::Engine> e, bool verify = true, int paths = 1,
                bool copy_on_write = false) {
        engine = std::move(e);
        SwapStoreOptions options;
        options.paths = {dir.path()};
        if (paths > 1) {
            options.paths.clear();
            for (int i = 0; i < paths; ++i) {
                const std::string sub = dir.path() + "/" + static_cast<char>('a' + i);
                ::mkdir(sub.c_str(), 0700);
                options.paths.push_back(sub);
            }
        }
        options.verify_checksums = verify;
        options.copy_on_write = copy_on_write;
        options.name = "test";
        ZINF_ASSIGN_OR_RETURN(store, SwapStore::create(*engine, options));
        return Status::ok();
    }
    ~Fixture() { store.reset(); }  // before the engine
};

TEST(SwapStore, RandomisedSequencesReadBackExactly) {
    const std::uint64_t seed = zinf::test::seed();
    for (const bool verify : {true, false}) {
        SCOPED_TRACE(verify ? "checksums on" : "checksums off");
        std::mt19937_64 rng(seed);
        Fixture f;
        ASSERT_TRUE(f.open(test::make_sim_engine(seed), verify, verify ? 1 : 3).is_ok());
        constexpr PartitionId kCount = 48;
        std::vector<std::uint64_t> sizes(kCount);
        for (PartitionId p = 0; p < kCount; ++p) {
            // Awkward sizes: tiny, around block and alignment boundaries, several blocks.
            const std::uint64_t pick[] = {1,
                                          7,
                                          4095,
                                          4096,
                                          4097,
                                          kSwapBlockBytes - 1,
                                          kSwapBlockBytes,
                                          kSwapBlockBytes + 1,
                                          3 * kSwapBlockBytes + 123,
                                          200'000};
            sizes[p] = (rng() % 3 == 0) ? pick[rng() % std::size(pick)] : 1 + rng() % 300'000;
            ASSERT_TRUE(f.store->reserve(1000 + p * 3, sizes[p]).is_ok());  // sparse ids
        }
        ASSERT_TRUE(f.store->commit().is_ok());

        std::map<PartitionId, std::vector<std::byte>> truth;  // what is valid on disk
        constexpr int kSlots = 6;
        struct Slot {
            SwapHandle handle;
            PartitionId partition = 0;
            bool write = false;
            bool busy = false;
            std::uint64_t offset = 0, length = 0, skip = 0;
            std::vector<std::byte> data;
        };
        std::vector<Slot> slots(kSlots);
        auto busy_with = [&](PartitionId p) {
            return std::any_of(slots.begin(), slots.end(),
                               [&](const Slot& s) { return s.busy && s.partition == p; });
        };
        auto finish = [&](Slot& s) {
            const Status st = s.handle.wait();
            ASSERT_TRUE(st.is_ok()) << st.to_string() << " (seed " << seed << ")";
            if (s.write) {
                EXPECT_TRUE(f.store->is_valid(s.partition));
            } else {
                const auto& want = truth.at(s.partition);
                ASSERT_TRUE(
                    std::equal(want.begin() + static_cast<std::ptrdiff_t>(s.offset),
                               want.begin() + static_cast<std::ptrdiff_t>(s.offset + s.length),
                               s.data.begin() + static_cast<std::ptrdiff_t>(s.skip)))
                    << "partition " << s.partition << " range " << s.offset << "+" << s.length
                    << " differs (seed " << seed << ")";
            }
            s.busy = false;
        };
        int ops = 0;
        for (int step = 0; step < 600; ++step) {
            Slot& s = slots[static_cast<std::size_t>(step % kSlots)];
            if (s.busy) finish(s);
            const PartitionId p = 1000 + static_cast<PartitionId>(rng() % kCount) * 3;
            if (busy_with(p)) continue;
            const std::uint64_t size = sizes[(p - 1000) / 3];
            const bool valid = f.store->is_valid(p);
            const int kind = valid ? static_cast<int>(rng() % 3) : 0;
            s.partition = p;
            s.busy = true;
            ++ops;
            if (kind == 0) {  // swap out new bytes
                s.write = true;
                truth[p] = test::random_bytes(size, rng);
                ASSERT_TRUE(f.store->swap_out(p, truth[p], s.handle).is_ok());
            } else if (kind == 1) {  // whole partition
                s.write = false;
                s.offset = 0;
                s.length = size;
                s.skip = 0;
                s.data.assign(size, std::byte{0});
                ASSERT_TRUE(f.store->swap_in(p, s.data, s.handle).is_ok());
            } else {  // a sub-range
                s.write = false;
                s.offset = rng() % size;
                s.length = 1 + rng() % (size - s.offset);
                const RangeRead r = f.store->range_read(p, s.offset, s.length);
                s.skip = r.skip_bytes;
                s.data.assign(r.read_length_bytes, std::byte{0});
                ASSERT_TRUE(
                    f.store->swap_in_range(p, s.offset, s.length, s.data, s.handle).is_ok());
            }
        }
        for (auto& s : slots) {
            if (s.busy) finish(s);
        }
        // Runs of consecutive partitions in one operation each way.
        std::vector<PartitionId> run;
        for (PartitionId i = 5; i < 15; ++i) run.push_back(1000 + i * 3);
        const std::uint64_t run_bytes = f.store->run_bytes(run.front(), run.back());
        auto buffer = AlignedBuffer::allocate(run_bytes, kExtentAlignmentBytes, true);
        for (PartitionId p : run) {
            truth[p] = test::random_bytes(sizes[(p - 1000) / 3], rng);
            std::copy(truth[p].begin(), truth[p].end(),
                      buffer->data() +
                          (f.store->extent(p).offset_bytes - f.store->extent(run[0]).offset_bytes));
        }
        SwapHandle h;
        ASSERT_TRUE(f.store->swap_out_run(run, buffer->span(), h).is_ok());
        ASSERT_TRUE(h.wait().is_ok());
        auto back = AlignedBuffer::allocate(run_bytes, kExtentAlignmentBytes, true);
        ASSERT_TRUE(f.store->swap_in_run(run, back->span(), h).is_ok());
        ASSERT_TRUE(h.wait().is_ok());
        for (PartitionId p : run) {
            const auto at = f.store->extent(p).offset_bytes - f.store->extent(run[0]).offset_bytes;
            EXPECT_TRUE(std::equal(truth[p].begin(), truth[p].end(), back->data() + at)) << p;
        }
        EXPECT_GT(ops, 400);
        if (verify) {
            EXPECT_GT(f.store->stats().checksum_bytes, 0u);
        }
    }
}

TEST(SwapStore, RunOfNonConsecutivePartitionsIsRejected) {
    Fixture f;
    ASSERT_TRUE(f.open(test::make_sim_engine(1)).is_ok());
    for (PartitionId p = 0; p < 4; ++p) ASSERT_TRUE(f.store->reserve(p, 5000).is_ok());
    ASSERT_TRUE(f.store->commit().is_ok());
    std::vector<std::byte> buffer(1 << 16);
    SwapHandle h;
    const PartitionId ids[] = {0, 2};
    EXPECT_EQ(f.store->swap_out_run(ids, buffer, h).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(f.store->swap_out(9, buffer, h).code(), StatusCode::kNotFound);
    EXPECT_EQ(f.store->swap_in(1, buffer, h).code(), StatusCode::kNotFound);  // never written
    EXPECT_EQ(f.store->reserve(1, 10).code(), StatusCode::kInvalidArgument);  // after commit
}

TEST(SwapStore, FlippedByteIsReportedWithPartitionAndOffset) {
    Fixture f;
    ASSERT_TRUE(f.open(test::make_file_engine()).is_ok());
    std::mt19937_64 rng(zinf::test::seed());
    ASSERT_TRUE(f.store->reserve(1, 10'000).is_ok());
    ASSERT_TRUE(f.store->reserve(42, 5 * kSwapBlockBytes + 1000).is_ok());
    ASSERT_TRUE(f.store->commit().is_ok());
    auto data = AlignedBuffer::allocate(5 * kSwapBlockBytes + 1000);
    test::fill_random(data->span(), rng);
    const std::span<const std::byte> bytes = data->span().first(5 * kSwapBlockBytes + 1000);
    SwapHandle h;
    ASSERT_TRUE(f.store->swap_out(42, bytes, h).is_ok());
    ASSERT_TRUE(h.wait().is_ok());

    // Flip one byte in block 3 of partition 42, behind the store's back.
    const std::uint64_t flip_at = 3 * kSwapBlockBytes + 777;
    const auto paths = f.store->data_file_paths();
    ASSERT_EQ(paths.size(), 1u);
    const int fd = ::open(paths[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t file_offset = static_cast<off_t>(f.store->extent(42).file_offset_bytes + flip_at);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, file_offset), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &c, 1, file_offset), 1);
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);

    auto back = AlignedBuffer::allocate(5 * kSwapBlockBytes + 1000);
    Status s = f.store->swap_in(42, back->span(), h);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    s = h.wait();
    ASSERT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
    EXPECT_NE(s.message().find("partition 42"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("offset " + std::to_string(3 * kSwapBlockBytes)), std::string::npos)
        << s.message();
    EXPECT_EQ(f.store->stats().corruptions, 1u);

    // A range that avoids block 3 reads fine; one that touches it does not.
    const RangeRead r = f.store->range_read(42, 100, 2 * kSwapBlockBytes);
    ASSERT_TRUE(f.store->swap_in_range(42, 100, 2 * kSwapBlockBytes, back->span(), h).is_ok());
    EXPECT_TRUE(h.wait().is_ok());
    EXPECT_TRUE(std::equal(bytes.begin() + 100, bytes.begin() + 100 + 2 * kSwapBlockBytes,
                           back->data() + r.skip_bytes));
    ASSERT_TRUE(f.store->swap_in_range(42, flip_at, 1, back->span(), h).is_ok());
    EXPECT_EQ(h.wait().code(), StatusCode::kCorruption);
}

TEST(SwapStore, FilesAreExclusivePrivateAndStriped) {
    Fixture f;
    ASSERT_TRUE(f.open(test::make_file_engine(), true, 2).is_ok());
    ASSERT_TRUE(f.store->reserve(0, 4 << 20).is_ok());
    ASSERT_TRUE(f.store->commit().is_ok());
    const auto paths = f.store->data_file_paths();
    ASSERT_EQ(paths.size(), 2u);
    for (const auto& path : paths) {
        struct stat st {};
        ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
        EXPECT_EQ(st.st_mode & 0777, 0600u);
        EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 2u << 20);  // preallocated
    }
    std::mt19937_64 rng(zinf::test::seed());
    auto data = AlignedBuffer::allocate(4 << 20);
    test::fill_random(data->span(), rng);
    SwapHandle h;
    ASSERT_TRUE(f.store->swap_out(0, data->span(), h).is_ok());
    ASSERT_TRUE(h.wait().is_ok());
    auto back = AlignedBuffer::allocate(4 << 20);
    ASSERT_TRUE(f.store->swap_in(0, back->span(), h).is_ok());
    ASSERT_TRUE(h.wait().is_ok());
    EXPECT_EQ(std::memcmp(back->data(), data->data(), 4 << 20), 0);
}

TEST(SwapStore, InsufficientSpaceFailsBeforeAnyWrite) {
    Fixture f;
    ASSERT_TRUE(f.open(test::make_file_engine()).is_ok());
    ASSERT_TRUE(f.store->reserve(0, 1ULL << 46).is_ok());  // 64 TiB
    const Status s = f.store->commit();
    ASSERT_EQ(s.code(), StatusCode::kNoSpace) << s.to_string();
    EXPECT_NE(s.message().find("need"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("free"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(" bytes) free"), std::string::npos) << s.message();
}

// ENOSPC during swap-outs (injected after N bytes): every swap-out reports it or succeeds, and
// exactly the successful ones are valid and read back.
TEST(SwapStore, EnospcLeavesNoPartitionFalselyValid) {
    const std::uint64_t seed = zinf::test::seed();
    for (const std::uint64_t limit : {100'000ULL, 700'000ULL, 1'500'000ULL}) {
        SCOPED_TRACE(limit);
        io::FaultPlan plan;
        plan.seed = seed;
        plan.enospc_after_bytes = limit;
        Fixture f;
        ASSERT_TRUE(f.open(test::make_sim_engine(seed, plan)).is_ok());
        constexpr PartitionId kCount = 24;
        for (PartitionId p = 0; p < kCount; ++p)
            ASSERT_TRUE(f.store->reserve(p, 90'000 + p * 1000).is_ok());
        ASSERT_TRUE(f.store->commit().is_ok());
        std::mt19937_64 rng(seed);
        std::map<PartitionId, std::vector<std::byte>> ok;
        int failures = 0;
        // Four in flight at a time, so that failures land among concurrent writes.
        for (PartitionId base = 0; base < kCount; base += 4) {
            SwapHandle h[4];
            std::vector<std::byte> data[4];
            for (PartitionId i = 0; i < 4; ++i) {
                data[i] = test::random_bytes(90'000 + (base + i) * 1000, rng);
                ASSERT_TRUE(f.store->swap_out(base + i, data[i], h[i]).is_ok());
            }
            for (PartitionId i = 0; i < 4; ++i) {
                const Status s = h[i].wait();
                if (s.is_ok()) {
                    ok[base + i] = std::move(data[i]);
                    EXPECT_TRUE(f.store->is_valid(base + i));
                } else {
                    ++failures;
                    EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.to_string();
                    EXPECT_FALSE(f.store->is_valid(base + i));
                }
            }
        }
        EXPECT_GT(failures, 0);
        for (PartitionId p = 0; p < kCount; ++p) {
            EXPECT_EQ(f.store->is_valid(p), ok.count(p) == 1) << p;
        }
        for (auto& [p, want] : ok) {
            std::vector<std::byte> back(want.size());
            SwapHandle h;
            ASSERT_TRUE(f.store->swap_in(p, back, h).is_ok());
            ASSERT_TRUE(h.wait().is_ok());
            EXPECT_EQ(back, want) << p;
        }
    }
}

// Injected read and write errors at every position of a short scenario end in a clean Status.
// Fail the n-th piece for every n the scenario reaches: each injected fault surfaces as exactly
// one error (a failed swap-out leaves the partition invalid, a failed swap-in leaves it valid
// and reports), and a run past the last piece injects nothing and fails nothing.
TEST(SwapStore, FailNthOpSweepEndsCleanly) {
    std::uint64_t reached = 0;
    for (std::uint64_t n = 1; n <= 200; ++n) {
        io::FaultPlan plan;
        plan.fail_nth_op = n;
        Fixture f;
        ASSERT_TRUE(f.open(test::make_sim_engine(n, plan, 1)).is_ok());
        for (PartitionId p = 0; p < 3; ++p) ASSERT_TRUE(f.store->reserve(p, 150'000).is_ok());
        ASSERT_TRUE(f.store->commit().is_ok());
        std::vector<std::byte> data(150'000, std::byte{3});
        std::vector<std::byte> back(150'000);
        std::uint64_t errors = 0;
        for (PartitionId p = 0; p < 3; ++p) {
            SwapHandle h;
            ASSERT_TRUE(f.store->swap_out(p, data, h).is_ok());
            const Status s = h.wait();
            if (!s.is_ok()) {
                ++errors;
                EXPECT_FALSE(f.store->is_valid(p));
                EXPECT_NE(s.message().find("offset"), std::string::npos) << s.to_string();
            }
        }
        for (PartitionId p = 0; p < 3; ++p) {
            if (!f.store->is_valid(p)) continue;
            SwapHandle h;
            ASSERT_TRUE(f.store->swap_in(p, back, h).is_ok());
            const Status s = h.wait();
            if (s.is_ok()) {
                EXPECT_EQ(back, data);
            } else {
                ++errors;
            }
        }
        const std::uint64_t injected = f.engine->stats().faults_injected;
        EXPECT_EQ(errors, injected) << "n=" << n;
        if (injected == 0) break;  // past the scenario's last piece
        reached = n;
    }
    EXPECT_GE(reached, 12u);  // the data and checksum pieces of 3 partitions, out and in
    EXPECT_LT(reached, 200u);
}

// Reads partition p (or the run from it) whole and returns its bytes.
std::vector<std::byte> read_back(SwapStore& store, PartitionId p, std::size_t bytes) {
    std::vector<std::byte> back(bytes);
    SwapHandle h;
    const Status s = store.swap_in(p, back, h);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (s.is_ok()) {
        EXPECT_TRUE(h.wait().is_ok());
    }
    return back;
}

Status write(SwapStore& store, PartitionId p, std::span<const std::byte> data, WriteTarget target) {
    SwapHandle h;
    ZINF_TRY(store.swap_out(p, data, h, target));
    return h.wait();
}

TEST(SwapStore, ShadowWriteKeepsTheCurrentCopyUntilCommit) {
    const std::uint64_t seed = zinf::test::seed();
    Fixture f;
    ASSERT_TRUE(f.open(test::make_sim_engine(seed), true, 1, true).is_ok());
    constexpr std::size_t kBytes = 3 * kSwapBlockBytes + 123;
    for (PartitionId p = 0; p < 4; ++p) ASSERT_TRUE(f.store->reserve(p, kBytes).is_ok());
    ASSERT_TRUE(f.store->commit().is_ok());
    EXPECT_EQ(f.store->file_bytes(), 2 * f.store->data_bytes());
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::byte>> current(4);
    for (PartitionId p = 0; p < 4; ++p) {
        current[p] = test::random_bytes(kBytes, rng);
        ASSERT_TRUE(write(*f.store, p, current[p], WriteTarget::kCurrent).is_ok());
    }
    // Several rounds: shadow-write a random subset, read (the current bytes), then commit or
    // discard at random; the bytes read are always the committed ones.
    for (int round = 0; round < 12; ++round) {
        SCOPED_TRACE(round);
        std::vector<std::vector<std::byte>> shadow(4);
        for (PartitionId p = 0; p < 4; ++p) {
            if (rng() % 3 == 0) continue;
            shadow[p] = test::random_bytes(kBytes, rng);
            ASSERT_TRUE(write(*f.store, p, shadow[p], WriteTarget::kShadow).is_ok());
            EXPECT_TRUE(f.store->has_shadow(p));
            EXPECT_TRUE(f.store->is_valid(p));
        }
        for (PartitionId p = 0; p < 4; ++p) EXPECT_EQ(read_back(*f.store, p, kBytes), current[p]);
        if (rng() % 2 == 0) {
            f.store->discard_shadows(0, 4);
        } else {
            auto switched = f.store->commit_shadows(0, 4);
            ASSERT_TRUE(switched.has_value()) << switched.status().to_string();
            std::size_t written = 0;
            for (PartitionId p = 0; p < 4; ++p) {
                if (shadow[p].empty()) continue;
                ++written;
                current[p] = shadow[p];
            }
            EXPECT_EQ(*switched, written);
        }
        for (PartitionId p = 0; p < 4; ++p) {
            EXPECT_FALSE(f.store->has_shadow(p));
            EXPECT_EQ(read_back(*f.store, p, kBytes), current[p]) << p;
        }
    }
    // A write of the current copy supersedes a pending shadow: a later commit keeps it.
    const auto pending = test::random_bytes(kBytes, rng);
    ASSERT_TRUE(write(*f.store, 2, pending, WriteTarget::kShadow).is_ok());
    current[2] = test::random_bytes(kBytes, rng);
    ASSERT_TRUE(write(*f.store, 2, current[2], WriteTarget::kCurrent).is_ok());
    EXPECT_FALSE(f.store->has_shadow(2));
    ASSERT_TRUE(f.store->commit_shadows(0, 4).has_value());
    EXPECT_EQ(read_back(*f.store, 2, kBytes), current[2]);
}

TEST(SwapStore, ShadowPlanesHaveTheirOwnChecksumsAndRunsStayInOnePlane) {
    Fixture f;
    ASSERT_TRUE(f.open(test::make_file_engine(), true, 1, true).is_ok());
    std::mt19937_64 rng(zinf::test::seed());
    constexpr std::size_t kBytes = 2 * kSwapBlockBytes;
    ASSERT_TRUE(f.store->reserve(7, kBytes).is_ok());
    ASSERT_TRUE(f.store->reserve(8, kBytes).is_ok());
    ASSERT_TRUE(f.store->commit().is_ok());
    auto a = AlignedBuffer::allocate(kBytes);
    auto b = AlignedBuffer::allocate(kBytes);
    test::fill_random(a->span(), rng);
    test::fill_random(b->span(), rng);
    ASSERT_TRUE(write(*f.store, 7, a->span().first(kBytes), WriteTarget::kCurrent).is_ok());
    ASSERT_TRUE(write(*f.store, 8, a->span().first(kBytes), WriteTarget::kCurrent).is_ok());
    ASSERT_TRUE(write(*f.store, 7, b->span().first(kBytes), WriteTarget::kShadow).is_ok());
    const Extent before = f.store->extent(7);

    // Flip a byte of the shadow's extent on disk: the current copy still verifies; after the
    // commit the shadow is current, and the flip is reported in its plane.
    const auto paths = f.store->data_file_paths();
    ASSERT_EQ(paths.size(), 1u);
    const off_t shadow_at =
        static_cast<off_t>(before.offset_bytes + (1 - before.plane) * f.store->data_bytes() + 99);
    const int fd = ::open(paths[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, shadow_at), 1);
    c ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &c, 1, shadow_at), 1);
    ::close(fd);
    EXPECT_EQ(std::memcmp(read_back(*f.store, 7, kBytes).data(), a->data(), kBytes), 0);

    // Only 7 has a shadow: after the commit 7 and 8 are in different planes, so a run of both
    // is refused, while each reads alone.
    ASSERT_TRUE(f.store->commit_shadows(7, 2).has_value());
    EXPECT_NE(f.store->extent(7).plane, before.plane);
    EXPECT_EQ(f.store->extent(7).file_offset_bytes, static_cast<std::uint64_t>(shadow_at - 99));
    const PartitionId run[2] = {7, 8};
    auto buffer = AlignedBuffer::allocate(f.store->run_bytes(7, 8));
    SwapHandle h;
    EXPECT_EQ(f.store->swap_in_run(run, buffer->span(), h).code(), StatusCode::kInvalidArgument);
    std::vector<std::byte> back(kBytes);
    ASSERT_TRUE(f.store->swap_in(7, back, h).is_ok());
    const Status s = h.wait();
    ASSERT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
    EXPECT_NE(s.message().find("partition 7 at offset 0"), std::string::npos) << s.message();
    EXPECT_EQ(std::memcmp(read_back(*f.store, 8, kBytes).data(), a->data(), kBytes), 0);

    // A store without copy-on-write refuses shadow writes.
    Fixture plain;
    ASSERT_TRUE(plain.open(test::make_file_engine()).is_ok());
    ASSERT_TRUE(plain.store->reserve(1, kBytes).is_ok());
    ASSERT_TRUE(plain.store->commit().is_ok());
    EXPECT_FALSE(plain.store->copy_on_write());
    EXPECT_EQ(write(*plain.store, 1, a->span().first(kBytes), WriteTarget::kShadow).code(),
              StatusCode::kInvalidArgument);
}

// Pins: a pinned copy reads back after commits of newer shadows; pinning what has no valid copy,
// pinning on a plain store and a pinned read of an unpinned partition are refused.
TEST(SwapStore, PinnedCopySurvivesCommitsAndBadPinsAreRefused) {
    const std::uint64_t seed = zinf::test::seed();
    Fixture f;
    ASSERT_TRUE(f.open(test::make_sim_engine(seed), true, 1, true).is_ok());
    constexpr std::size_t kBytes = 100'000;
    ASSERT_TRUE(f.store->reserve(0, kBytes).is_ok());
    ASSERT_TRUE(f.store->reserve(1, kBytes).is_ok());
    ASSERT_TRUE(f.store->commit().is_ok());
    std::mt19937_64 rng(seed);
    const auto first = test::random_bytes(kBytes, rng);
    const auto second = test::random_bytes(kBytes, rng);
    EXPECT_EQ(f.store->pin(0, 1).code(), StatusCode::kNotFound);  // never written
    ASSERT_TRUE(write(*f.store, 0, first, WriteTarget::kCurrent).is_ok());
    ASSERT_TRUE(f.store->pin(0, 1).is_ok());
    EXPECT_TRUE(f.store->is_pinned(0));
    ASSERT_TRUE(write(*f.store, 0, second, WriteTarget::kShadow).is_ok());
    ASSERT_TRUE(f.store->commit_shadows(0, 1).has_value());
    EXPECT_EQ(read_back(*f.store, 0, kBytes), second);  // the current copy
    std::vector<std::byte> back(kBytes);
    const PartitionId run[1] = {0};
    SwapHandle h;
    ASSERT_TRUE(f.store->swap_in_pinned_run(run, back, h).is_ok());
    ASSERT_TRUE(h.wait().is_ok());
    EXPECT_EQ(back, first);  // the pinned one
    f.store->unpin(0, 1);
    EXPECT_FALSE(f.store->is_pinned(0));
    EXPECT_EQ(f.store->swap_in_pinned_run(run, back, h).code(), StatusCode::kInvalidArgument);
    // Unpinned, the old extent takes the next shadow without waiting.
    ASSERT_TRUE(write(*f.store, 0, first, WriteTarget::kShadow).is_ok());
    EXPECT_EQ(f.store->stats().pin_wait_ns, 0u);

    Fixture plain;
    ASSERT_TRUE(plain.open(test::make_sim_engine(seed)).is_ok());
    ASSERT_TRUE(plain.store->reserve(0, kBytes).is_ok());
    ASSERT_TRUE(plain.store->commit().is_ok());
    ASSERT_TRUE(write(*plain.store, 0, first, WriteTarget::kCurrent).is_ok());
    EXPECT_EQ(plain.store->pin(0, 1).code(), StatusCode::kInvalidArgument);
}

// A fault at every position of four concurrent shadow writes: the commit is all or nothing.
// When any shadow failed it is refused and every partition reads its old bytes.
TEST(SwapStore, ShadowCommitIsAllOrNothingUnderFaults) {
    std::uint64_t reached = 0;
    for (std::uint64_t n = 1; n <= 100; ++n) {
        SCOPED_TRACE(n);
        Fixture f;
        io::FaultPlan plan;
        plan.fail_nth_op = n;
        ASSERT_TRUE(f.open(test::make_sim_engine(n, plan, 1), true, 1, true).is_ok());
        constexpr std::size_t kBytes = 150'000;
        for (PartitionId p = 0; p < 4; ++p) ASSERT_TRUE(f.store->reserve(p, kBytes).is_ok());
        ASSERT_TRUE(f.store->commit().is_ok());
        std::mt19937_64 rng(n);
        std::vector<std::vector<std::byte>> old(4), next(4);
        bool set_up = true;
        for (PartitionId p = 0; p < 4; ++p) {
            old[p] = test::random_bytes(kBytes, rng);
            next[p] = test::random_bytes(kBytes, rng);
            set_up = set_up && write(*f.store, p, old[p], WriteTarget::kCurrent).is_ok();
        }
        if (!set_up) continue;  // the fault hit the first copies: not this test's subject
        SwapHandle h[4];
        int failed = 0;
        for (PartitionId p = 0; p < 4; ++p) {
            ASSERT_TRUE(f.store->swap_out(p, next[p], h[p], WriteTarget::kShadow).is_ok());
        }
        for (PartitionId p = 0; p < 4; ++p) failed += h[p].wait().is_ok() ? 0 : 1;
        const auto committed = f.store->commit_shadows(0, 4);
        EXPECT_EQ(committed.has_value(), failed == 0);
        if (!committed.has_value()) {
            EXPECT_EQ(committed.status().code(), StatusCode::kIo);
            EXPECT_NE(committed.status().message().find("commit refused"), std::string::npos);
        }
        // Past the shadow writes' last piece (the reads would meet the fault; the commit's
        // bytes are read back by ShadowWriteKeepsTheCurrentCopyUntilCommit).
        if (failed == 0) break;
        // The fault has fired: the reads see none.
        for (PartitionId p = 0; p < 4; ++p) EXPECT_EQ(read_back(*f.store, p, kBytes), old[p]) << p;
        ++reached;
    }
    EXPECT_GE(reached, 4u);  // every shadow write failed once
}

}  // namespace
}  // namespace zinf::swap
