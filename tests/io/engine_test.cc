// io::Engine behaviour beyond the per-backend conformance: striping, keeping queues full for
// small requests, handle reuse and timeouts, backend choice, statistics; a batch the kernel takes
// only part of, or refuses (Seams::submit); registered buffers and files counted per piece.
#include "io/engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "io/backend.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

using Tristate = io::DirectMode;

// Engine options whose requests are cut into `block`-byte pieces, `queue_depth` in flight on
// each of `threads` workers.
AioOptions pieces_of(std::uint64_t block, int queue_depth, int threads) {
    AioOptions aio;
    aio.block_size_bytes = block;
    aio.queue_depth = queue_depth;
    aio.intra_op_parallelism = threads;
    return aio;
}

// An engine on the simulated device, each piece taking latency_us_min..latency_us_max, with
// one file created on it.
struct SimEngine {
    std::unique_ptr<Engine> engine;
    FileId file = 0;
};
Result<SimEngine> sim_engine_with_file(const std::string& name, std::uint32_t latency_us_min,
                                       std::uint32_t latency_us_max, const AioOptions& aio = {}) {
    EngineOptions o;
    o.aio = aio;
    SimOptions sim;
    sim.latency_us_min = latency_us_min;
    sim.latency_us_max = latency_us_max;
    o.sim = sim;
    SimEngine s;
    ZINF_ASSIGN_OR_RETURN(s.engine, Engine::create(o));
    FileOptions fo;
    fo.create = true;
    ZINF_ASSIGN_OR_RETURN(s.file, s.engine->open(name, fo));
    return s;
}

TEST(Engine, StripesRoundRobinOverThreeDirectories) {
    zinf::test::TempDir a("s0"), b("s1"), c("s2");
    std::string skip;
    auto engine = make_engine("io_uring", Tristate::kAuto, &skip);
    if (!engine) {
        GTEST_SKIP() << skip;
    }
    constexpr std::uint64_t kChunk = 64 * 1024;
    const std::vector<std::string> paths = {a.file("x"), b.file("x"), c.file("x")};
    FileOptions fo;
    fo.create = true;
    fo.stripe_chunk_bytes = kChunk;
    auto file = engine->open(paths, fo);
    ASSERT_TRUE(file.has_value()) << file.error().to_string();
    // 10 chunks and a bit, starting inside chunk 0: pieces must split at chunk boundaries.
    constexpr std::uint64_t kStart = 4096;
    constexpr std::size_t kBytes = 10 * kChunk + 5000;
    AlignedBuffer out = must_allocate(kBytes);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    ASSERT_TRUE(engine->write(*file, kStart, out.span()).is_ok());
    // Check the physical layout with plain reads of each stripe file.
    std::vector<std::byte> got(kChunk);
    for (std::uint64_t logical = kStart; logical < kStart + kBytes;) {
        const std::uint64_t chunk = logical / kChunk;
        const std::uint64_t within = logical % kChunk;
        const std::uint64_t n = std::min<std::uint64_t>(kChunk - within, kStart + kBytes - logical);
        const std::string& path = paths[chunk % 3];
        FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        ASSERT_TRUE(fd.valid());
        const auto physical = static_cast<off_t>((chunk / 3) * kChunk + within);
        ASSERT_EQ(::pread(fd.get(), got.data(), n, physical), static_cast<ssize_t>(n));
        ASSERT_EQ(std::memcmp(got.data(), out.data() + (logical - kStart), n), 0)
            << "chunk " << chunk;
        logical += n;
    }
    AlignedBuffer in = must_allocate(kBytes);
    ASSERT_TRUE(engine->read(*file, kStart, in.span()).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data(), kBytes), 0);
    ASSERT_TRUE(engine->sync(*file).is_ok());
    EXPECT_TRUE(engine->close(*file).is_ok());
}

TEST(Engine, PreallocationSplitsOverStripes) {
    zinf::test::TempDir a("p0"), b("p1"), c("p2");
    std::string skip;
    auto engine = make_engine("posix", Tristate::kOff, &skip);
    ASSERT_TRUE(engine);
    FileOptions fo;
    fo.create = true;
    fo.stripe_chunk_bytes = 4096;
    fo.preallocate_bytes = 7 * 4096 + 100;  // stripes get 3, 2 (+100), 2 chunks
    auto file = engine->open(std::vector<std::string>{a.file("x"), b.file("x"), c.file("x")}, fo);
    ASSERT_TRUE(file.has_value()) << file.error().to_string();
    struct stat st {};
    ASSERT_EQ(::stat(a.file("x").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 3 * 4096);
    ASSERT_EQ(::stat(b.file("x").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 2 * 4096 + 100);
    ASSERT_EQ(::stat(c.file("x").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 2 * 4096);
}

// One worker, queue depth 8, 16 pieces of 5 ms each: with a full queue that is two rounds
// (~10 ms); one piece at a time would be 80 ms.
TEST(Engine, SmallRequestKeepsTheQueueFull) {
    auto sim = sim_engine_with_file("q", 5000, 5000, pieces_of(4096, 8, 1));
    ASSERT_TRUE(sim.has_value()) << sim.error().to_string();
    Engine& engine = *sim->engine;
    const FileId file = sim->file;
    AlignedBuffer buffer = must_allocate(16 * 4096);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(engine.write(file, 0, buffer.span()).is_ok());
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    EXPECT_LT(ms, 45) << "pieces of one request did not overlap";
    EXPECT_EQ(engine.stats().pieces_completed, 16u);
}

// Two workers with queue depth 2 share one 8-piece request: about 2 rounds (50 ms), not 4.
TEST(Engine, PiecesSpreadOverWorkers) {
    auto sim = sim_engine_with_file("w", 25000, 25000, pieces_of(4096, 2, 2));
    ASSERT_TRUE(sim.has_value()) << sim.error().to_string();
    Engine& engine = *sim->engine;
    const FileId file = sim->file;
    AlignedBuffer buffer = must_allocate(8 * 4096);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(engine.write(file, 0, buffer.span()).is_ok());
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    EXPECT_LT(ms, 90) << "the second worker did not take pieces of the request";
}

// An urgent operation goes ahead of those queued before it that are not (pieces in flight are
// not preempted); without urgency the queue is first come, first served. One worker, two pieces
// in flight, 5 ms a piece: four 4-piece writes take about 8 rounds; the urgent one-piece read
// submitted after them is done while the last write still waits, the plain one after it.
TEST(Engine, UrgentOperationsGoAheadOfTheQueue) {
    for (const bool urgent : {true, false}) {
        SCOPED_TRACE(urgent ? "urgent" : "not urgent");
        auto sim = sim_engine_with_file("u", 5000, 5000, pieces_of(4096, 2, 1));
        ASSERT_TRUE(sim.has_value()) << sim.error().to_string();
        Engine& engine = *sim->engine;
        const FileId file = sim->file;
        AlignedBuffer buffer = must_allocate(2 * 4096);
        ASSERT_TRUE(engine.write(file, 0, buffer.span()).is_ok());  // what the reads read
        AlignedBuffer bulk_buffer = must_allocate(4 * 4 * 4096);
        std::array<IoHandle, 4> bulk;
        for (std::size_t i = 0; i < bulk.size(); ++i) {
            ASSERT_TRUE(engine
                            .submit_write(bulk[i], file, (2 + i * 4) * 4096,
                                          bulk_buffer.span().subspan(i * 4 * 4096, 4 * 4096))
                            .is_ok());
        }
        IoHandle first;
        IoHandle second;  // FIFO among urgent ones: after `first`
        first.set_urgent(urgent);
        second.set_urgent(urgent);
        ASSERT_TRUE(engine.submit_read(first, file, 0, buffer.span().first(4096)).is_ok());
        ASSERT_TRUE(engine.submit_read(second, file, 4096, buffer.span().last(4096)).is_ok());
        ASSERT_TRUE(second.wait().is_ok());
        EXPECT_TRUE(first.done());
        EXPECT_EQ(!bulk.back().done(), urgent);
        for (IoHandle& h : bulk) ASSERT_TRUE(h.wait().is_ok());
        // The engine goes on as before: a later plain operation after a drained urgent one.
        IoHandle later;
        ASSERT_TRUE(engine.submit_read(later, file, 0, buffer.span().first(4096)).is_ok());
        ASSERT_TRUE(later.wait_for(kHangTimeout).is_ok());
    }
}

TEST(Engine, WaitForTimesOutWithoutLosingTheOperation) {
    auto sim = sim_engine_with_file("slow", 200000, 200000);
    ASSERT_TRUE(sim.has_value()) << sim.error().to_string();
    Engine& engine = *sim->engine;
    const FileId file = sim->file;
    AlignedBuffer buffer = must_allocate(4096);
    IoHandle h;
    ASSERT_TRUE(engine.submit_write(h, file, 0, buffer.span()).is_ok());
    EXPECT_FALSE(h.done());
    const Status early = h.wait_for(std::chrono::milliseconds(10));
    EXPECT_EQ(early.code(), StatusCode::kTimeout);
    // The handle cannot be reused while in flight.
    const Status again = engine.submit_write(h, file, 0, buffer.span());
    EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(h.wait().is_ok());
    EXPECT_TRUE(h.done());
    EXPECT_EQ(h.bytes(), 4096u);
    // Reuse after completion.
    ASSERT_TRUE(engine.submit_read(h, file, 0, buffer.span()).is_ok());
    EXPECT_TRUE(h.wait_for(kHangTimeout).is_ok());
}

TEST(Engine, SeveralThreadsWaitOnOneHandle) {
    auto sim = sim_engine_with_file("shared", 50000, 50000);
    ASSERT_TRUE(sim.has_value()) << sim.error().to_string();
    Engine& engine = *sim->engine;
    const FileId file = sim->file;
    AlignedBuffer buffer = must_allocate(4096);
    IoHandle h;
    ASSERT_TRUE(engine.submit_write(h, file, 0, buffer.span()).is_ok());
    // Blocking waiters, a waiter with a deadline long enough and one too short: every one that
    // sleeps on the handle is woken by the one completion, none misses it.
    std::atomic<int> ok{0};
    std::atomic<int> timed_out{0};
    std::vector<std::thread> waiters;
    for (int i = 0; i < 3; ++i) {
        waiters.emplace_back([&] { ok += h.wait().is_ok() ? 1 : 0; });
        waiters.emplace_back([&] { ok += h.wait_for(kHangTimeout).is_ok() ? 1 : 0; });
    }
    waiters.emplace_back([&] {
        timed_out +=
            h.wait_for(std::chrono::milliseconds(1)).code() == StatusCode::kTimeout ? 1 : 0;
    });
    for (auto& t : waiters) t.join();
    EXPECT_EQ(ok.load(), 6);
    EXPECT_EQ(timed_out.load(), 1);
    EXPECT_TRUE(h.done());
}

TEST(Engine, HandleMayBeDestroyedAsSoonAsItsWaitReturns) {
    // Two workers complete the pieces of one operation concurrently; whichever finishes last
    // completes it, and the waiter frees the handle at once. Nothing may touch the handle after
    // that (AddressSanitizer reports a use after free if the completing worker does).
    auto sim = sim_engine_with_file("free-after-wait", 0, 20, pieces_of(4096, 4, 2));
    ASSERT_TRUE(sim.has_value()) << sim.error().to_string();
    Engine& engine = *sim->engine;
    const FileId file = sim->file;
    AlignedBuffer buffer = must_allocate(4 * 4096);
    ASSERT_TRUE(engine.write(file, 0, buffer.span()).is_ok());
    for (int i = 0; i < 2000; ++i) {
        auto h = std::make_unique<IoHandle>();
        ASSERT_TRUE(engine.submit_read(*h, file, 0, buffer.span()).is_ok());
        ASSERT_TRUE(h->wait().is_ok());
        h.reset();
    }
    EXPECT_EQ(engine.stats().requests_completed, 2001u);
    EXPECT_EQ(engine.stats().pieces_completed, 2001u * 4);
}

TEST(Engine, DestructorDrainsInFlightOperations) {
    zinf::test::TempDir dir("drain");
    std::string skip;
    AlignedBuffer buffer = must_allocate(4 << 20);
    IoHandle handles[4];
    {
        auto engine = make_engine("io_uring", Tristate::kOn, &skip);
        if (!engine) {
            GTEST_SKIP() << skip;
        }
        FileOptions fo;
        fo.create = true;
        auto file = engine->open(dir.file("d"), fo);
        ASSERT_TRUE(file.has_value());
        for (int i = 0; i < 4; ++i) {
            ASSERT_TRUE(engine
                            ->submit_write(
                                handles[i], *file, static_cast<std::uint64_t>(i) << 20,
                                buffer.span().subspan(static_cast<std::size_t>(i) << 20, 1 << 20))
                            .is_ok());
        }
    }
    for (auto& h : handles) {
        EXPECT_TRUE(h.done());
        EXPECT_TRUE(h.wait().is_ok());
    }
}

TEST(Engine, AutoChoosesABackendAndOthersFollowIt) {
    std::string skip;
    auto engine = make_engine("auto", Tristate::kAuto, &skip);
    ASSERT_TRUE(engine);
    const std::string name(engine->backend_name());
    EXPECT_TRUE(name == "io_uring" || name == "libaio" || name == "posix") << name;
}

TEST(Engine, NamedBackendThatCannotBeSetUpIsAnError) {
    EngineOptions o;
    o.aio.backend = "io_uring";
    o.aio.sqpoll = true;
    o.aio.queue_depth = 4096;
    o.aio.intra_op_parallelism = 1;
    // SQPOLL works as root on this kernel; an unknown name never does.
    o.aio.backend = "nvme-of";
    auto engine = Engine::create(o);
    ASSERT_FALSE(engine.has_value());
    EXPECT_NE(engine.error().message().find("nvme-of"), std::string::npos)
        << engine.error().to_string();
}

TEST(Engine, SqpollAndSingleSubmitAndNoOverlapStillRoundTrip) {
    zinf::test::TempDir dir("modes");
    for (int mode = 0; mode < 3; ++mode) {
        io::AioOptions aio = small_aio("io_uring", Tristate::kAuto);
        aio.sqpoll = mode == 0;
        aio.single_submit = mode == 1;
        aio.overlap_events = mode != 2;
        std::string skip;
        auto engine = make_engine("io_uring", Tristate::kAuto, &skip, std::nullopt, &aio);
        if (!engine) {
            if (mode == 0) continue;  // SQPOLL may need privileges
            GTEST_SKIP() << skip;
        }
        FileOptions fo;
        fo.create = true;
        auto file = engine->open(dir.file(str_cat("m", mode)), fo);
        ASSERT_TRUE(file.has_value());
        AlignedBuffer out = must_allocate(1 << 20), in = must_allocate(1 << 20);
        std::mt19937_64 rng(zinf::test::seed() + static_cast<std::uint64_t>(mode));
        fill_random(out.span(), rng);
        ASSERT_TRUE(engine->write(*file, 0, out.span()).is_ok()) << mode;
        ASSERT_TRUE(engine->read(*file, 0, in.span()).is_ok()) << mode;
        EXPECT_EQ(std::memcmp(in.data(), out.data(), 1 << 20), 0) << mode;
    }
}

TEST(Engine, StatsCountAndReset) {
    std::string skip;
    auto engine = make_engine("sim", Tristate::kAuto, &skip);
    ASSERT_TRUE(engine);
    FileOptions fo;
    fo.create = true;
    auto file = engine->open("s", fo);
    ASSERT_TRUE(file.has_value());
    AlignedBuffer buffer = must_allocate(256 * 1024);
    ASSERT_TRUE(engine->write(*file, 0, buffer.span()).is_ok());
    ASSERT_TRUE(engine->read(*file, 0, buffer.span()).is_ok());
    EngineStats s = engine->stats();
    EXPECT_EQ(s.bytes_written, 256u * 1024);
    EXPECT_EQ(s.bytes_read, 256u * 1024);
    EXPECT_EQ(s.requests_completed, 2u);
    EXPECT_EQ(s.pieces_completed, 8u);  // 64 KiB blocks
    engine->reset_stats();
    s = engine->stats();
    EXPECT_EQ(s.bytes_read, 0u);
    EXPECT_EQ(s.latency_us_p50, 0.0);
}

// A submit seam for one engine worker: the n-th call (1-based) gets calls[n - 1], later calls
// go through whole, or, with refuse_all, every call is refused with EIO. Counts the kernel's
// results per piece (64 KiB index) and direction, so that a piece handed to the kernel twice
// shows.
struct EngineSubmitScript {
    std::array<SubmitCall, 2> calls{};
    std::size_t call_count = 0;
    bool refuse_all = false;
    std::atomic<std::size_t> made{0};
    std::atomic<std::size_t> refused{0};                        // calls that took nothing
    std::array<std::array<std::atomic<int>, 32>, 2> results{};  // [write, read][piece]
};

SubmitCall engine_submit(void* context, std::size_t offered) noexcept {
    auto& script = *static_cast<EngineSubmitScript*>(context);
    const std::size_t n = script.made.fetch_add(1);
    SubmitCall call{offered, 0};
    if (script.refuse_all) {
        call = SubmitCall{0, EIO};
    } else if (n < script.call_count) {
        call = script.calls[n];
    }
    if (call.limit == 0) script.refused.fetch_add(1);
    return call;
}

long engine_result(void* context, const Request& r, long result) noexcept {
    auto& script = *static_cast<EngineSubmitScript*>(context);
    script.results[r.op == OpKind::kRead ? 1 : 0][r.offset_bytes / (64 * 1024)].fetch_add(1);
    return result;
}

// io_uring and libaio, the backends with a submit system call; one worker, queue depth 8,
// pieces of 64 KiB.
class EngineSubmit : public ::testing::TestWithParam<std::string> {
protected:
    std::unique_ptr<Engine> make(EngineSubmitScript& script) {
        io::AioOptions aio = small_aio(GetParam(), Tristate::kAuto);
        aio.intra_op_parallelism = 1;
        Seams seams;
        seams.submit = &engine_submit;
        seams.result = &engine_result;
        seams.context = &script;
        std::string skip;
        auto engine = make_engine(GetParam(), Tristate::kAuto, &skip, std::nullopt, &aio, seams);
        if (!engine) skip_ = skip;
        return engine;
    }
    FileId open(Engine& engine) {
        FileOptions fo;
        fo.create = true;
        auto file = engine.open(dir_.file("f"), fo);
        EXPECT_TRUE(file.has_value()) << file.error().to_string();
        return file.has_value() ? *file : 0;
    }
    std::string skip_;
    zinf::test::TempDir dir_{"engine-submit"};
};

TEST_P(EngineSubmit, PartlyTakenBatchSendsTheRestOnceAndLosesNothing) {
    EngineSubmitScript script;
    script.calls[0] = SubmitCall{3, EIO};  // the kernel takes 3 of the 8 pieces, then fails
    script.call_count = 1;
    auto engine = make(script);
    if (!engine) {
        GTEST_SKIP() << skip_;
    }
    const FileId file = open(*engine);
    AlignedBuffer out = must_allocate(1 << 20), in = must_allocate(1 << 20);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    ASSERT_TRUE(engine->write(file, 0, out.span()).is_ok());
    ASSERT_TRUE(engine->read(file, 0, in.span()).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data(), 1 << 20), 0);
    for (std::size_t piece = 0; piece < 16; ++piece) {
        EXPECT_EQ(script.results[0][piece].load(), 1) << "write piece " << piece;
        EXPECT_EQ(script.results[1][piece].load(), 1) << "read piece " << piece;
    }
    EXPECT_EQ(engine->stats().pieces_completed, 32u);
    EXPECT_EQ(engine->stats().requests_completed, 2u);
}

TEST_P(EngineSubmit, RefusedBatchFailsItsFirstPieceOnceAndSendsTheOthers) {
    EngineSubmitScript script;
    script.calls[0] = SubmitCall{0, EIO};
    script.call_count = 1;
    auto engine = make(script);
    if (!engine) {
        GTEST_SKIP() << skip_;
    }
    const FileId file = open(*engine);
    AlignedBuffer out = must_allocate(1 << 20);
    const Status st = engine->write(file, 0, out.span());
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kIo) << st.to_string();
    EXPECT_EQ(st.errno_value(), EIO);
    EXPECT_NE(st.message().find("write " + dir_.file("f") + " offset 0 length 65536: "),
              std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find(GetParam() == "io_uring" ? "io_uring_submit" : "io_submit"),
              std::string::npos)
        << st.to_string();
    // The first batch was the 8 pieces that fit in the queue: the first failed without reaching
    // the kernel; the other 7 went once each; no piece of the failed operation was cut after.
    EXPECT_EQ(script.results[0][0].load(), 0);
    for (std::size_t piece = 1; piece < 8; ++piece)
        EXPECT_EQ(script.results[0][piece].load(), 1) << piece;
    for (std::size_t piece = 8; piece < 16; ++piece)
        EXPECT_EQ(script.results[0][piece].load(), 0) << piece;
    EXPECT_EQ(engine->stats().pieces_completed, 8u);
    // The engine goes on working.
    EXPECT_TRUE(engine->write(file, 0, out.span()).is_ok());
}

TEST_P(EngineSubmit, LastingRefusalFailsEveryPieceExactlyOnceWithoutAHang) {
    EngineSubmitScript script;
    script.refuse_all = true;
    auto engine = make(script);
    if (!engine) {
        GTEST_SKIP() << skip_;
    }
    const FileId file = open(*engine);
    AlignedBuffer out = must_allocate(1 << 20);
    IoHandle a, b;
    const Engine::BatchItem items[2] = {
        {&a, OpKind::kWrite, file, 0, out.span().subspan(0, 512 << 10)},
        {&b, OpKind::kWrite, file, 512 << 10, out.span().subspan(512 << 10)}};
    ASSERT_TRUE(engine->submit(items).is_ok());
    const Status sa = a.wait_for(kHangTimeout);
    const Status sb = b.wait_for(kHangTimeout);
    EXPECT_EQ(sa.errno_value(), EIO) << sa.to_string();
    EXPECT_EQ(sb.errno_value(), EIO) << sb.to_string();
    // Each refusal failed one piece, and no piece reached the kernel.
    EXPECT_EQ(engine->stats().pieces_completed, script.refused.load());
    for (std::size_t piece = 0; piece < 16; ++piece)
        EXPECT_EQ(script.results[0][piece].load(), 0) << piece;
}

INSTANTIATE_TEST_SUITE_P(KernelSubmitBackends, EngineSubmit,
                         ::testing::Values("io_uring", "libaio"));

// With registered buffers, every piece inside the registered region uses the fixed opcodes on a
// registered file; without, none does, and the counts say so.
TEST(Engine, FixedBufferAndFileCountsMatchThePiecesMoved) {
    zinf::test::TempDir dir("fixed-counts");
    for (const bool registered : {true, false}) {
        SCOPED_TRACE(registered ? "register_buffers on" : "register_buffers off");
        io::AioOptions aio = small_aio("io_uring", Tristate::kAuto);
        aio.register_buffers = registered;
        std::string skip;
        auto engine = make_engine("io_uring", Tristate::kAuto, &skip, std::nullopt, &aio);
        if (!engine) {
            GTEST_SKIP() << skip;
        }
        FileOptions fo;
        fo.create = true;
        auto file = engine->open(dir.file(registered ? "on" : "off"), fo);
        ASSERT_TRUE(file.has_value());
        AlignedBuffer region = must_allocate(2 << 20);
        ASSERT_TRUE(engine->register_buffers(region.span()).is_ok());
        ASSERT_TRUE(engine->write(*file, 0, region.span().subspan(0, 1 << 20)).is_ok());
        ASSERT_TRUE(engine->read(*file, 0, region.span().subspan(1 << 20, 1 << 20)).is_ok());
        const EngineStats s = engine->stats();
        EXPECT_EQ(s.pieces_completed, 32u);
        EXPECT_EQ(s.pieces_fixed_buffer_written, registered ? 16u : 0u);
        EXPECT_EQ(s.pieces_fixed_buffer_read, registered ? 16u : 0u);
        EXPECT_EQ(s.pieces_fixed_file, registered ? 32u : 0u);
        EXPECT_EQ(s.pieces_plain, registered ? 0u : 32u);
        // A buffer outside the region goes plain on a fixed file.
        AlignedBuffer outside = must_allocate(64 * 1024);
        engine->reset_stats();
        ASSERT_TRUE(engine->write(*file, 0, outside.span()).is_ok());
        EXPECT_EQ(engine->stats().pieces_fixed_buffer_written, 0u);
        EXPECT_EQ(engine->stats().pieces_fixed_file, registered ? 1u : 0u);
        EXPECT_EQ(engine->stats().pieces_plain, registered ? 0u : 1u);
    }
}

}  // namespace
}  // namespace zinf::io::test
