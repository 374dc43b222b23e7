// The conformance suite every backend passes, through io::Engine: {io_uring, libaio, posix, sim}
// × {direct on, off}. Random data at random offsets and sizes, aligned and not; concurrent
// submitters; end of file; registered buffers; statistics. And each branch of the completion rule
// (io/detail/completion.h) reached through each backend's own completion path: end of file and
// short reads with real files; EAGAIN, EINTR, short and zero-byte writes, EINVAL after a short
// read and kernel errors, which no real file gives on demand, through Seams::result, which
// rewrites the kernel's answer before the backend classifies it.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "io/backend.h"
#include "io/engine.h"
#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

using Tristate = io::DirectMode;

struct Param {
    std::string backend;
    bool direct;
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    return info.param.backend + (info.param.direct ? "_direct" : "_buffered");
}

class BackendConformance : public ::testing::TestWithParam<Param> {
protected:
    void SetUp() override {
        std::string skip;
        engine_ = make_engine(GetParam().backend,
                              GetParam().direct ? Tristate::kOn : Tristate::kOff, &skip);
        if (engine_ == nullptr && !skip.empty()) {
            GTEST_SKIP() << skip;
        }
        ASSERT_NE(engine_, nullptr);
        if (GetParam().backend != "sim") {
            EXPECT_EQ(engine_->backend_name(), GetParam().backend);
        }
    }

    FileId open_file(const std::string& name, std::uint64_t preallocate = 0) {
        FileOptions fo;
        fo.create = true;
        fo.preallocate_bytes = preallocate;
        auto id = engine_->open(dir_.file(name), fo);
        EXPECT_TRUE(id.has_value()) << id.error().to_string();
        return id.has_value() ? *id : 0;
    }

    // Another engine like engine_, whose backends pass every raw result through `rewrite`, with
    // `context` (by default the count of rewrites_).
    std::unique_ptr<Engine> engine_with(long (*rewrite)(void*, const Request&, long) noexcept,
                                        void* context = nullptr) {
        Seams seams;
        seams.result = rewrite;
        seams.context = context != nullptr ? context : &rewrites_;
        std::string skip;
        auto engine =
            make_engine(GetParam().backend, GetParam().direct ? Tristate::kOn : Tristate::kOff,
                        &skip, std::nullopt, nullptr, seams);
        EXPECT_NE(engine, nullptr) << skip;
        return engine;
    }

    FileId open_on(Engine& engine, const std::string& name) {
        FileOptions fo;
        fo.create = true;
        auto id = engine.open(dir_.file(name), fo);
        EXPECT_TRUE(id.has_value()) << id.error().to_string();
        return id.has_value() ? *id : 0;
    }

    // Writes `bytes` bytes at offset 0, then reads them back into the same buffer: the read's
    // status (the write must succeed).
    Status read_after_write(Engine& engine, FileId file, std::size_t bytes) {
        AlignedBuffer buffer = must_allocate(bytes);
        const Status w = engine.write(file, 0, buffer.span());
        EXPECT_TRUE(w.is_ok()) << w.to_string();
        return engine.read(file, 0, buffer.span());
    }

    // Writes 1 MiB of random bytes (16 pieces of 64 KiB) and reads them back; returns whether
    // both succeeded with the same bytes.
    ::testing::AssertionResult round_trip(Engine& engine, FileId file) {
        constexpr std::size_t kBytes = 1 << 20;
        AlignedBuffer out = must_allocate(kBytes);
        AlignedBuffer in = must_allocate(kBytes);
        std::mt19937_64 rng(zinf::test::seed());
        fill_random(out.span(), rng);
        const Status w = engine.write(file, 0, out.span());
        if (!w.is_ok()) return ::testing::AssertionFailure() << w.to_string();
        const Status r = engine.read(file, 0, in.span());
        if (!r.is_ok()) return ::testing::AssertionFailure() << r.to_string();
        if (std::memcmp(in.data(), out.data(), kBytes) != 0) {
            return ::testing::AssertionFailure() << "the bytes read back differ";
        }
        return ::testing::AssertionSuccess();
    }

    zinf::test::TempDir dir_{"conf"};
    std::unique_ptr<Engine> engine_;
    std::atomic<std::uint64_t> rewrites_{0};  // results the seam changed
};

// The seams: each turns the kernel's answer into another it could have given. They run on the
// workers (posix: on its helper threads), hence the atomic count.
std::atomic<std::uint64_t>& count_of(void* context) {
    return *static_cast<std::atomic<std::uint64_t>*>(context);
}

// The first answer to a piece of 8 KiB or more moves half of it (4 KiB-aligned, as a short
// O_DIRECT transfer would).
long halve_first(void* context, const Request& r, long result) noexcept {
    if (r.done_bytes != 0 || result != static_cast<long>(r.length_bytes) || r.length_bytes < 8192) {
        return result;
    }
    count_of(context).fetch_add(1);
    return static_cast<long>(align_down(r.length_bytes / 2, 4096));
}

// Each piece meets EAGAIN, then EINTR, then the kernel's real answer.
long eagain_then_eintr(void* context, const Request& r, long result) noexcept {
    if (r.retries >= 2) return result;
    count_of(context).fetch_add(1);
    return r.retries == 0 ? -EAGAIN : -EINTR;
}

long eagain_on_reads(void* context, const Request& r, long result) noexcept {
    if (r.op != OpKind::kRead) return result;
    count_of(context).fetch_add(1);
    return -EAGAIN;
}

long zero_once_on_writes(void* context, const Request& r, long result) noexcept {
    if (r.op != OpKind::kWrite || r.retries != 0) return result;
    count_of(context).fetch_add(1);
    return 0;
}

long zero_on_writes(void* context, const Request& r, long result) noexcept {
    if (r.op != OpKind::kWrite) return result;
    count_of(context).fetch_add(1);
    return 0;
}

// Once a read has come back short, the kernel refuses the (unaligned) rest with EINVAL, as some
// file systems do at the end of a file opened with O_DIRECT.
long einval_after_short_read(void* context, const Request& r, long result) noexcept {
    if (r.op != OpKind::kRead || r.done_bytes == 0) return result;
    count_of(context).fetch_add(1);
    return -EINVAL;
}

long einval_on_reads(void* context, const Request& r, long result) noexcept {
    if (r.op != OpKind::kRead) return result;
    count_of(context).fetch_add(1);
    return -EINVAL;
}

long eio_on_reads(void* context, const Request& r, long result) noexcept {
    if (r.op != OpKind::kRead) return result;
    count_of(context).fetch_add(1);
    return -EIO;
}

// Writes `bytes` bytes of a pattern at offset 0 and checks the engine wrote them.
void write_prefix(Engine& engine, FileId file, std::span<std::byte> bytes) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
    ASSERT_TRUE(engine.write(file, 0, bytes).is_ok());
}

TEST_P(BackendConformance, RandomRoundTrips) {
    constexpr std::size_t kFileBytes = 6 << 20;
    const FileId file = open_file("data", kFileBytes);
    EXPECT_EQ(engine_->is_direct(file), GetParam().direct);
    if (GetParam().direct && GetParam().backend != "sim") {
        EXPECT_GE(engine_->alignment_bytes(file), 512u);
    }
    std::vector<std::byte> model(kFileBytes);
    std::mt19937_64 rng(zinf::test::seed());
    AlignedBuffer buffer = must_allocate(1 << 20);
    AlignedBuffer readback = must_allocate(1 << 20);
    for (int round = 0; round < 30; ++round) {
        const bool aligned = round % 2 == 0;
        std::size_t size = 1 + rng() % (900 * 1024);
        std::uint64_t offset = rng() % (kFileBytes - size);
        std::size_t shift = 0;  // buffer misalignment
        if (aligned) {
            size = std::max<std::size_t>(4096, align_down(size, 4096));
            offset = align_down(offset, 4096);
        } else {
            shift = 1 + rng() % 511;
            size = std::min(size, buffer.size() - shift);
        }
        std::span<std::byte> out = buffer.span().subspan(shift, size);
        fill_random(out, rng);
        ASSERT_TRUE(engine_->write(file, offset, out).is_ok()) << "round " << round;
        std::memcpy(model.data() + offset, out.data(), size);
        // Read a random region back into a buffer with its own misalignment.
        const std::size_t rsize = 1 + rng() % (readback.size() - 512);
        const std::uint64_t roffset =
            aligned ? align_down(rng() % (kFileBytes - rsize), 512) : rng() % (kFileBytes - rsize);
        const std::size_t rshift = aligned ? 0 : 1 + rng() % 300;
        const std::size_t rlen =
            aligned ? std::max<std::size_t>(512, align_down(rsize, 512)) : rsize;
        std::span<std::byte> in =
            readback.span().subspan(rshift, std::min(rlen, readback.size() - rshift));
        const Status st = engine_->read(file, roffset, in);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        ASSERT_EQ(std::memcmp(in.data(), model.data() + roffset, in.size()), 0)
            << "round " << round << " offset " << roffset << " length " << in.size();
    }
    // The whole file through 1 MiB reads.
    for (std::uint64_t at = 0; at < kFileBytes; at += readback.size()) {
        ASSERT_TRUE(engine_->read(file, at, readback.span()).is_ok());
        ASSERT_EQ(std::memcmp(readback.data(), model.data() + at, readback.size()), 0) << at;
    }
    const EngineStats stats = engine_->stats();
    EXPECT_GT(stats.bytes_written, 0u);
    EXPECT_GT(stats.bytes_read, kFileBytes - 1);
    EXPECT_GT(stats.pieces_completed, stats.requests_completed);
    EXPECT_GT(stats.latency_us_p99, 0.0);
    EXPECT_GE(stats.latency_us_p99, stats.latency_us_p50);
    EXPECT_TRUE(engine_->close(file).is_ok());
}

TEST_P(BackendConformance, FourConcurrentSubmitters) {
    constexpr std::size_t kRegion = 1 << 20;
    const FileId file = open_file("shared", 4 * kRegion);
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937_64 rng(zinf::test::seed() + static_cast<std::uint64_t>(t));
            AlignedBuffer out = must_allocate(kRegion);
            AlignedBuffer in = must_allocate(kRegion);
            for (int round = 0; round < 6; ++round) {
                fill_random(out.span(), rng);
                // Four handles in flight per thread: quarter regions, submitted as one batch.
                IoHandle handles[4];
                Engine::BatchItem items[4];
                for (int q = 0; q < 4; ++q) {
                    items[q] = {&handles[q], OpKind::kWrite, file,
                                static_cast<std::uint64_t>(t) * kRegion + q * (kRegion / 4),
                                out.span().subspan(q * (kRegion / 4), kRegion / 4)};
                }
                if (!engine_->submit(items).is_ok()) ++failures;
                for (auto& h : handles) {
                    if (!h.wait_for(kHangTimeout).is_ok()) ++failures;
                }
                IoHandle r;
                if (!engine_
                         ->submit_read(r, file, static_cast<std::uint64_t>(t) * kRegion, in.span())
                         .is_ok())
                    ++failures;
                if (!r.wait_for(kHangTimeout).is_ok()) ++failures;
                if (std::memcmp(in.data(), out.data(), kRegion) != 0) ++failures;
            }
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
}

TEST_P(BackendConformance, ReadPastEndOfFileIsAnErrorWithContext) {
    const FileId file = open_file("short");
    AlignedBuffer buffer = must_allocate(64 * 1024);
    ASSERT_TRUE(engine_->write(file, 0, buffer.span().subspan(0, 10000)).is_ok());
    // Unaligned length: whole pages direct and the rest buffered; aligned: direct, where the
    // short read ends unaligned.
    for (std::size_t length : {std::size_t{20000}, std::size_t{16384}, std::size_t{65536}}) {
        IoHandle h;
        ASSERT_TRUE(engine_->submit_read(h, file, 0, buffer.span().subspan(0, length)).is_ok());
        const Status st = h.wait_for(kHangTimeout);
        ASSERT_FALSE(st.is_ok()) << length;
        EXPECT_NE(st.code(), StatusCode::kTimeout);
        EXPECT_NE(st.message().find("unexpected end of file"), std::string::npos) << st.to_string();
        EXPECT_NE(st.message().find(dir_.file("short")), std::string::npos) << st.to_string();
        EXPECT_NE(st.message().find("read "), std::string::npos) << st.to_string();
        // The piece that met the end: offset 0, or, where the request's whole pages went
        // direct, the buffered rest after them.
        EXPECT_TRUE(st.message().find("offset 0 length") != std::string::npos ||
                    st.message().find("offset 16384 length 3616") != std::string::npos)
            << st.to_string();
    }
}

TEST_P(BackendConformance, RegisteredBuffersRoundTrip) {
    const FileId file = open_file("fixed", 4 << 20);
    AlignedBuffer region = must_allocate(4 << 20);
    ASSERT_TRUE(engine_->register_buffers(region.span()).is_ok());
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(region.span().subspan(0, 2 << 20), rng);
    ASSERT_TRUE(engine_->write(file, 0, region.span().subspan(0, 2 << 20)).is_ok());
    // Read into the second half (inside the region) and into an odd slice of it.
    ASSERT_TRUE(engine_->read(file, 0, region.span().subspan(2 << 20, 2 << 20)).is_ok());
    EXPECT_EQ(std::memcmp(region.data(), region.data() + (2 << 20), 2 << 20), 0);
    ASSERT_TRUE(engine_->read(file, 4096, region.span().subspan((2 << 20) + 7, 100000)).is_ok());
    EXPECT_EQ(std::memcmp(region.data() + 4096, region.data() + (2 << 20) + 7, 100000), 0);
}

TEST_P(BackendConformance, ManyOperationsInOneBatch) {
    constexpr int kOps = 64;
    constexpr std::size_t kOpBytes = 12288 + 100;  // odd size: a direct bulk and a buffered tail
    const FileId file = open_file("batch");
    AlignedBuffer out = must_allocate(kOps * 16384);
    AlignedBuffer in = must_allocate(kOps * 16384);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    std::vector<IoHandle> handles(kOps);
    std::vector<Engine::BatchItem> items;
    for (int i = 0; i < kOps; ++i) {
        items.push_back({&handles[i], OpKind::kWrite, file, static_cast<std::uint64_t>(i) * 16384,
                         out.span().subspan(static_cast<std::size_t>(i) * 16384, kOpBytes)});
    }
    ASSERT_TRUE(engine_->submit(items).is_ok());
    for (auto& h : handles) ASSERT_TRUE(h.wait_for(kHangTimeout).is_ok());
    for (int i = 0; i < kOps; ++i) {
        items[i].op = OpKind::kRead;
        items[i].buffer = in.span().subspan(static_cast<std::size_t>(i) * 16384, kOpBytes);
    }
    ASSERT_TRUE(engine_->submit(items).is_ok());
    for (auto& h : handles) ASSERT_TRUE(h.wait_for(kHangTimeout).is_ok());
    for (int i = 0; i < kOps; ++i) {
        ASSERT_EQ(std::memcmp(in.data() + i * 16384, out.data() + i * 16384, kOpBytes), 0) << i;
    }
}

TEST_P(BackendConformance, ReadCrossingTheEndIsResubmittedThenMeetsTheEnd) {
    // Real: 10000 bytes in the file; a read of 16384 comes back short, the rest comes back empty.
    const FileId file = open_file("crossing");
    AlignedBuffer out = must_allocate(16384);
    write_prefix(*engine_, file, out.span().subspan(0, 10000));
    engine_->reset_stats();
    AlignedBuffer in = must_allocate(16384);
    const Status st = engine_->read(file, 0, in.span());
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("unexpected end of file"), std::string::npos) << st.to_string();
    EXPECT_EQ(engine_->stats().short_transfers_resubmitted, 1u);
    EXPECT_EQ(engine_->stats().pieces_completed, 1u);
    // The bytes before the end arrived, where they belong.
    EXPECT_EQ(std::memcmp(in.data(), out.data(), 10000), 0);
}

TEST_P(BackendConformance, ReadAtTheEndIsEndOfFileAtOnce) {
    const FileId file = open_file("at-end");
    AlignedBuffer buffer = must_allocate(8192);
    write_prefix(*engine_, file, buffer.span().subspan(0, 4096));
    engine_->reset_stats();
    const Status st = engine_->read(file, 4096, buffer.span().subspan(0, 4096));
    EXPECT_NE(st.message().find("unexpected end of file"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("offset 4096 length 4096"), std::string::npos) << st.to_string();
    EXPECT_EQ(engine_->stats().short_transfers_resubmitted, 0u);
}

TEST_P(BackendConformance, ShortTransfersAreResubmittedUntilEveryByteMoved) {
    auto engine = engine_with(&halve_first);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "short");
    EXPECT_TRUE(round_trip(*engine, file));
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.pieces_completed, 32u);
    EXPECT_EQ(stats.short_transfers_resubmitted, 32u);  // every piece, write and read
    EXPECT_EQ(rewrites_.load(), 32u);
}

TEST_P(BackendConformance, EagainAndEintrAreRetriedAndTheDataSurvives) {
    auto engine = engine_with(&eagain_then_eintr);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "retry");
    EXPECT_TRUE(round_trip(*engine, file));
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.pieces_completed, 32u);
    EXPECT_EQ(stats.retries, 64u);
    EXPECT_EQ(rewrites_.load(), 64u);
}

TEST_P(BackendConformance, EagainBeyondTheRetryBoundFailsTheReadWithEagain) {
    auto engine = engine_with(&eagain_on_reads);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "eagain");
    const Status st = read_after_write(*engine, file, 64 * 1024);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.errno_value(), EAGAIN) << st.to_string();
    EXPECT_NE(st.message().find("read " + dir_.file("eagain")), std::string::npos)
        << st.to_string();
    // One piece: the first answer and kMaxRetries retries, then the error.
    EXPECT_EQ(engine->stats().retries, static_cast<std::uint64_t>(kMaxRetries));
    EXPECT_EQ(rewrites_.load(), static_cast<std::uint64_t>(kMaxRetries) + 1);
}

TEST_P(BackendConformance, ZeroByteWriteIsRetried) {
    auto engine = engine_with(&zero_once_on_writes);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "zero-once");
    EXPECT_TRUE(round_trip(*engine, file));
    EXPECT_EQ(engine->stats().retries, 16u);  // one per write piece
}

TEST_P(BackendConformance, ZeroByteWritesBeyondTheRetryBoundFailWithEio) {
    auto engine = engine_with(&zero_on_writes);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "zero");
    AlignedBuffer buffer = must_allocate(4096);
    const Status st = engine->write(file, 0, buffer.span());
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.errno_value(), EIO) << st.to_string();
    EXPECT_NE(st.message().find("write "), std::string::npos) << st.to_string();
    EXPECT_EQ(engine->stats().retries, static_cast<std::uint64_t>(kMaxRetries));
}

TEST_P(BackendConformance, EinvalAfterAShortReadAtTheEndIsEndOfFile) {
    auto engine = engine_with(&einval_after_short_read);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "einval-end");
    AlignedBuffer buffer = must_allocate(16384);
    write_prefix(*engine, file, buffer.span().subspan(0, 10000));
    const Status st = engine->read(file, 0, buffer.span());
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("unexpected end of file"), std::string::npos) << st.to_string();
    EXPECT_EQ(rewrites_.load(), 1u);  // the real short read, then the refused rest
}

TEST_P(BackendConformance, EinvalOnAFreshReadIsAnErrorNotEndOfFile) {
    auto engine = engine_with(&einval_on_reads);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "einval");
    const Status st = read_after_write(*engine, file, 16384);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.errno_value(), EINVAL) << st.to_string();
    EXPECT_EQ(st.message().find("end of file"), std::string::npos) << st.to_string();
}

TEST_P(BackendConformance, KernelErrorReachesTheCallerOnceWithContext) {
    auto engine = engine_with(&eio_on_reads);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "eio");
    const Status st = read_after_write(*engine, file, 64 * 1024);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.errno_value(), EIO) << st.to_string();
    EXPECT_NE(st.message().find("read " + dir_.file("eio") + " offset 0 length 65536"),
              std::string::npos)
        << st.to_string();
    EXPECT_EQ(engine->stats().retries, 0u);  // not retried: only EAGAIN and EINTR are
    EXPECT_EQ(rewrites_.load(), 1u);
}

// Every piece handed to the kernel: its file range and whether it went through an O_DIRECT
// descriptor. Filled by record_piece on the workers (posix: its helper threads).
struct PieceLog {
    struct Piece {
        std::uint64_t offset;
        std::uint64_t length;
        bool direct;
    };
    std::mutex mutex;
    std::vector<Piece> pieces;
};

long record_piece(void* context, const Request& r, long result) noexcept {
    if (r.done_bytes != 0 || r.retries != 0) return result;  // its first answer only
    auto& log = *static_cast<PieceLog*>(context);
    const int flags = ::fcntl(r.fd, F_GETFL);
    const std::lock_guard lock(log.mutex);
    log.pieces.push_back({r.offset_bytes, r.length_bytes, flags >= 0 && (flags & O_DIRECT) != 0});
    return result;
}

// A request whose buffer and file offset agree modulo the O_DIRECT alignment but sit mid-page
// can go direct from the next page boundary on. Its buffered head and tail must not share a page
// with its direct pieces: the buffered write dirties the whole page, and writing it back can
// land over the bytes the direct write put there (the kernel logs "Page cache invalidation
// failure on direct I/O"); buffered reads then see stale data.
TEST_P(BackendConformance, DirectAndBufferedPiecesOfARequestNeverShareAPage) {
    constexpr std::size_t kPage = 4096;
    constexpr std::size_t kFileBytes = 2 << 20;
    PieceLog log;
    auto engine = engine_with(&record_piece, &log);
    ASSERT_NE(engine, nullptr);
    const FileId file = open_on(*engine, "pages");
    std::vector<std::byte> model(kFileBytes);
    AlignedBuffer out = must_allocate(1 << 20);
    AlignedBuffer in = must_allocate(1 << 20);
    std::mt19937_64 rng(zinf::test::seed());
    // Mid-page starts that agree with the buffer modulo 512; lengths that end mid-page.
    for (const std::size_t shift : {std::size_t{332}, std::size_t{512 + 100}, std::size_t{4000}}) {
        for (int round = 0; round < 4; ++round) {
            const std::uint64_t offset = (1 + rng() % 200) * kPage + shift;
            const std::size_t length = 3 * kPage + rng() % (600 * 1024);
            std::span<std::byte> bytes = out.span().subspan(shift, length);
            fill_random(bytes, rng);
            {
                const std::lock_guard lock(log.mutex);
                log.pieces.clear();
            }
            ASSERT_TRUE(engine->write(file, offset, bytes).is_ok());
            std::memcpy(model.data() + offset, bytes.data(), length);
            std::map<std::uint64_t, unsigned> modes;  // page -> 1 buffered, 2 direct
            std::uint64_t direct_bytes = 0, covered = 0;
            {
                const std::lock_guard lock(log.mutex);
                for (const auto& p : log.pieces) {
                    covered += p.length;
                    if (p.direct) direct_bytes += p.length;
                    for (std::uint64_t page = p.offset / kPage;
                         page <= (p.offset + p.length - 1) / kPage; ++page) {
                        modes[page] |= p.direct ? 2u : 1u;
                    }
                }
            }
            EXPECT_EQ(covered, length);
            for (const auto& [page, m] : modes) {
                EXPECT_NE(m, 3u) << "page " << page << " written both direct and buffered";
            }
            if (GetParam().backend == "sim") {
                // Simulated pieces have no descriptor to ask.
            } else if (GetParam().direct) {
                EXPECT_EQ(direct_bytes,
                          align_down(offset + length, kPage) - align_up(offset, kPage))
                    << "every whole page goes direct";
            } else {
                EXPECT_EQ(direct_bytes, 0u);
            }
            // Read back through a buffer misaligned another way: buffered, from the page cache.
            std::span<std::byte> back = in.span().subspan(7, length);
            ASSERT_TRUE(engine->read(file, offset, back).is_ok());
            ASSERT_EQ(std::memcmp(back.data(), model.data() + offset, length), 0)
                << "shift " << shift << " round " << round;
        }
    }
    EXPECT_TRUE(engine->close(file).is_ok());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendConformance,
                         ::testing::Values(Param{"io_uring", true}, Param{"io_uring", false},
                                           Param{"libaio", true}, Param{"libaio", false},
                                           Param{"posix", true}, Param{"posix", false},
                                           Param{"sim", true}, Param{"sim", false}),
                         param_name);

}  // namespace
}  // namespace zinf::io::test
