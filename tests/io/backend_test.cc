// Backend-level contract, on each system backend directly: the queue-full answer, completion
// callbacks, end of file, registered buffers and files, make_backend's choices; and a submit
// system call that fails part way (Seams::submit), after which the requests the kernel did not
// take come back untouched.
#include "io/backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>

#include "src/base/file.h"
#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

struct Completion {
    int calls = 0;
    Status status;
};

void record(Request& r, const Status& s) {
    auto* c = static_cast<Completion*>(r.user);
    ++c->calls;
    c->status = s;
}

class BackendDirect : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        BackendOptions o;
        o.kind = GetParam();
        o.queue_depth = 4;
        auto b = make_backend(o, nullptr);
        if (!b.has_value()) {
            GTEST_SKIP() << b.error().to_string();
        }
        backend_ = std::move(b).value();
        fd_ = FileDescriptor(::open(dir_.file("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
        ASSERT_TRUE(fd_.valid());
        buffer_ = must_allocate(8 * 4096);
    }
    void TearDown() override {
        if (backend_) {
            EXPECT_EQ(backend_->in_flight_count(), 0u);
        }
    }
    void prepare(Request& r, Completion& c, OpKind op, std::uint64_t offset, std::uint32_t length,
                 std::byte* buffer) {
        r = Request{};
        r.op = op;
        r.fd = fd_.get();
        r.offset_bytes = offset;
        r.length_bytes = length;
        r.buffer = buffer;
        r.callback = &record;
        r.user = &c;
    }
    std::size_t reap_all() {
        std::size_t n = 0;
        for (int i = 0; i < 1000 && backend_->in_flight_count() > 0; ++i) {
            auto r = backend_->reap(1, std::chrono::milliseconds(100));
            EXPECT_TRUE(r.has_value());
            if (r.has_value()) n += *r;
        }
        return n;
    }

    zinf::test::TempDir dir_{"backend"};
    std::unique_ptr<Backend> backend_;
    FileDescriptor fd_;
    AlignedBuffer buffer_;
};

TEST_P(BackendDirect, QueueFullThenBusyThenDrains) {
    EXPECT_EQ(backend_->name(), GetParam());
    EXPECT_EQ(backend_->queue_depth(), 4u);
    Request reqs[6];
    Completion done[6];
    Request* ptrs[6];
    for (int i = 0; i < 6; ++i) {
        prepare(reqs[i], done[i], OpKind::kWrite, static_cast<std::uint64_t>(i) * 4096, 4096,
                buffer_.data() + i * 4096);
        ptrs[i] = &reqs[i];
    }
    auto accepted = backend_->submit(std::span<Request* const>(ptrs, 6));
    ASSERT_TRUE(accepted.has_value());
    EXPECT_EQ(*accepted, 4u);
    EXPECT_EQ(backend_->in_flight_count(), 4u);
    auto busy = backend_->submit(std::span<Request* const>(ptrs + 4, 2));
    ASSERT_FALSE(busy.has_value());
    EXPECT_EQ(busy.error().code(), StatusCode::kBusy);
    EXPECT_EQ(reap_all(), 4u);
    accepted = backend_->submit(std::span<Request* const>(ptrs + 4, 2));
    ASSERT_TRUE(accepted.has_value());
    EXPECT_EQ(*accepted, 2u);
    EXPECT_EQ(reap_all(), 2u);
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(done[i].calls, 1) << i;
        EXPECT_TRUE(done[i].status.is_ok()) << done[i].status.to_string();
        EXPECT_EQ(reqs[i].state, Request::State::kIdle);
        EXPECT_EQ(reqs[i].done_bytes, 4096u);
    }
    // A non-blocking reap with nothing in flight returns at once.
    auto none = backend_->reap(0, std::chrono::microseconds(0));
    ASSERT_TRUE(none.has_value());
    EXPECT_EQ(*none, 0u);
}

TEST_P(BackendDirect, ReadAtEndOfFileReportsIt) {
    ASSERT_EQ(::pwrite(fd_.get(), buffer_.data(), 100, 0), 100);
    Request r;
    Completion c;
    prepare(r, c, OpKind::kRead, 0, 4096, buffer_.data());
    Request* p = &r;
    ASSERT_TRUE(backend_->submit(std::span<Request* const>(&p, 1)).has_value());
    reap_all();
    ASSERT_EQ(c.calls, 1);
    EXPECT_NE(c.status.message().find("unexpected end of file"), std::string::npos)
        << c.status.to_string();
    EXPECT_EQ(r.done_bytes, 100u);
}

TEST_P(BackendDirect, BadDescriptorIsAnErrorNotAHang) {
    Request r;
    Completion c;
    prepare(r, c, OpKind::kRead, 0, 4096, buffer_.data());
    r.fd = 1000000;  // never open
    Request* p = &r;
    auto accepted = backend_->submit(std::span<Request* const>(&p, 1));
    if (!accepted.has_value()) {
        // libaio: io_submit itself refuses the iocb, so the request comes back untouched with
        // the call's error (io_uring and posix meet it at completion).
        EXPECT_EQ(accepted.error().errno_value(), EBADF) << accepted.error().to_string();
        EXPECT_EQ(r.state, Request::State::kIdle);
        EXPECT_EQ(c.calls, 0);
        EXPECT_EQ(backend_->in_flight_count(), 0u);
        return;
    }
    reap_all();
    ASSERT_EQ(c.calls, 1);
    EXPECT_FALSE(c.status.is_ok());
    EXPECT_EQ(c.status.errno_value(), EBADF) << c.status.to_string();
}

TEST_P(BackendDirect, RegisteredBuffersAndFiles) {
    std::span<std::byte> regions[1] = {buffer_.span()};
    ASSERT_TRUE(backend_->register_buffers(regions).is_ok());
    ASSERT_TRUE(backend_->register_file(3, fd_.get()).is_ok());
    fill_random(buffer_.span().subspan(0, 4096), *std::make_unique<std::mt19937_64>(7));
    Request w;
    Completion cw;
    prepare(w, cw, OpKind::kWrite, 0, 4096, buffer_.data());
    w.buffer_index = 0;
    w.fixed_file_index = 3;
    Request* p = &w;
    ASSERT_TRUE(backend_->submit(std::span<Request* const>(&p, 1)).has_value());
    reap_all();
    ASSERT_TRUE(cw.status.is_ok()) << cw.status.to_string();
    Request r;
    Completion cr;
    prepare(r, cr, OpKind::kRead, 0, 4096, buffer_.data() + 4096);
    r.buffer_index = 0;
    r.fixed_file_index = 3;
    p = &r;
    ASSERT_TRUE(backend_->submit(std::span<Request* const>(&p, 1)).has_value());
    reap_all();
    ASSERT_TRUE(cr.status.is_ok()) << cr.status.to_string();
    EXPECT_EQ(std::memcmp(buffer_.data(), buffer_.data() + 4096, 4096), 0);
    EXPECT_TRUE(backend_->register_file(3, -1).is_ok());
}

INSTANTIATE_TEST_SUITE_P(SystemBackends, BackendDirect,
                         ::testing::Values("io_uring", "libaio", "posix"));

// The script of a submit seam: the n-th call (1-based) gets calls[n - 1]; later calls go
// through whole. Counts, by 4 KiB index, the raw results the kernel gave each request, so that a
// request handed to the kernel twice shows.
struct SubmitScript {
    std::array<SubmitCall, 4> calls{};
    std::size_t call_count = 0;  // scripted calls
    std::size_t made = 0;
    std::array<std::atomic<int>, 8> results{};
};

SubmitCall scripted_submit(void* context, std::size_t offered) noexcept {
    auto& script = *static_cast<SubmitScript*>(context);
    const std::size_t n = script.made++;
    return n < script.call_count ? script.calls[n] : SubmitCall{offered, 0};
}

long count_result(void* context, const Request& r, long result) noexcept {
    auto& script = *static_cast<SubmitScript*>(context);
    script.results[r.offset_bytes / 4096].fetch_add(1);
    return result;
}

// io_uring and libaio: the backends with a submit system call (posix's helper threads make none).
class SubmitSyscall : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        fd_ = FileDescriptor(::open(dir_.file("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
        ASSERT_TRUE(fd_.valid());
        buffer_ = must_allocate(4 * 4096);
        for (std::size_t i = 0; i < buffer_.size(); ++i)
            buffer_.data()[i] = static_cast<std::byte>(i / 4096 + 1);
    }
    // A backend of queue depth 4 that follows `script`; null (and the test skipped) when the
    // backend is not available here.
    std::unique_ptr<Backend> make(SubmitScript& script, bool single_submit = false) {
        BackendOptions o;
        o.kind = GetParam();
        o.queue_depth = 4;
        o.single_submit = single_submit;
        o.seams.submit = &scripted_submit;
        o.seams.result = &count_result;
        o.seams.context = &script;
        auto b = make_backend(o, nullptr);
        if (!b.has_value()) return nullptr;
        return std::move(b).value();
    }
    // Four writes of 4 KiB, each of its own byte value, at offsets 0, 4096, 8192, 12288.
    void prepare_writes() {
        for (int i = 0; i < 4; ++i) {
            reqs_[i] = Request{};
            reqs_[i].op = OpKind::kWrite;
            reqs_[i].fd = fd_.get();
            reqs_[i].offset_bytes = static_cast<std::uint64_t>(i) * 4096;
            reqs_[i].length_bytes = 4096;
            reqs_[i].buffer = buffer_.data() + i * 4096;
            reqs_[i].callback = &record;
            reqs_[i].user = &done_[i];
            ptrs_[i] = &reqs_[i];
        }
    }
    static std::size_t reap_all(Backend& backend) {
        std::size_t n = 0;
        for (int i = 0; i < 1000 && backend.in_flight_count() > 0; ++i) {
            auto r = backend.reap(1, std::chrono::milliseconds(100));
            EXPECT_TRUE(r.has_value());
            if (r.has_value()) n += *r;
        }
        return n;
    }
    // Each request completed once, OK, and its bytes are in the file.
    void expect_each_written_once(const SubmitScript& script) {
        for (int i = 0; i < 4; ++i) {
            EXPECT_EQ(done_[i].calls, 1) << i;
            EXPECT_TRUE(done_[i].status.is_ok()) << i << ": " << done_[i].status.to_string();
            EXPECT_EQ(script.results[static_cast<std::size_t>(i)].load(), 1)
                << "kernel results of request " << i;
            EXPECT_EQ(reqs_[i].state, Request::State::kIdle);
        }
        std::vector<std::byte> file(4 * 4096);
        ASSERT_EQ(::pread(fd_.get(), file.data(), file.size(), 0),
                  static_cast<ssize_t>(file.size()));
        EXPECT_EQ(std::memcmp(file.data(), buffer_.data(), file.size()), 0);
    }
    void expect_untouched(int i) {
        const Request& r = reqs_[i];
        EXPECT_EQ(r.state, Request::State::kIdle) << i;
        EXPECT_EQ(r.done_bytes, 0u) << i;
        EXPECT_EQ(r.retries, 0) << i;
        EXPECT_EQ(r.fd, fd_.get()) << i;
        EXPECT_EQ(r.callback, &record) << i;
        EXPECT_EQ(r.user, &done_[i]) << i;
        EXPECT_EQ(done_[i].calls, 0) << i;
    }

    zinf::test::TempDir dir_{"submit"};
    FileDescriptor fd_;
    AlignedBuffer buffer_;
    Request reqs_[4];
    Completion done_[4];
    Request* ptrs_[4] = {};
};

TEST_P(SubmitSyscall, FailingPartWayHandsBackTheUntakenUntouched) {
    for (const bool single_submit : {false, true}) {
        SCOPED_TRACE(single_submit ? "single_submit" : "batched");
        SubmitScript script;
        if (single_submit) {
            // One call per request: two go through, the third fails.
            script.calls = {SubmitCall{1, 0}, SubmitCall{1, 0}, SubmitCall{0, EIO}};
            script.call_count = 3;
        } else {
            // The kernel takes two of the four, then the call fails.
            script.calls[0] = SubmitCall{2, EIO};
            script.call_count = 1;
        }
        auto backend = make(script, single_submit);
        if (!backend) {
            GTEST_SKIP() << GetParam() << " is not available here";
        }
        prepare_writes();
        for (auto& d : done_) d = Completion{};
        auto accepted = backend->submit(std::span<Request* const>(ptrs_, 4));
        ASSERT_TRUE(accepted.has_value()) << accepted.error().to_string();
        EXPECT_EQ(*accepted, 2u);
        EXPECT_EQ(backend->in_flight_count(), 2u);
        EXPECT_EQ(reqs_[0].state, Request::State::kInFlight);
        EXPECT_EQ(reqs_[1].state, Request::State::kInFlight);
        expect_untouched(2);
        expect_untouched(3);
        // What the kernel took completes; nothing else does, also after further enters.
        EXPECT_EQ(reap_all(*backend), 2u);
        auto none = backend->reap(0, std::chrono::milliseconds(20));
        ASSERT_TRUE(none.has_value());
        EXPECT_EQ(*none, 0u);
        expect_untouched(2);
        expect_untouched(3);
        // The two handed back are submitted again, once, and complete once.
        accepted = backend->submit(std::span<Request* const>(ptrs_ + 2, 2));
        ASSERT_TRUE(accepted.has_value()) << accepted.error().to_string();
        EXPECT_EQ(*accepted, 2u);
        EXPECT_EQ(reap_all(*backend), 2u);
        expect_each_written_once(script);
        EXPECT_EQ(backend->in_flight_count(), 0u);
    }
}

TEST_P(SubmitSyscall, RefusedOutrightIsTheCallsErrorAndTakesNothing) {
    SubmitScript script;
    script.calls[0] = SubmitCall{0, EIO};
    script.call_count = 1;
    auto backend = make(script);
    if (!backend) {
        GTEST_SKIP() << GetParam() << " is not available here";
    }
    prepare_writes();
    auto refused = backend->submit(std::span<Request* const>(ptrs_, 4));
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code(), StatusCode::kIo) << refused.error().to_string();
    EXPECT_EQ(refused.error().errno_value(), EIO);
    EXPECT_NE(
        refused.error().message().find(GetParam() == "io_uring" ? "io_uring_submit" : "io_submit"),
        std::string::npos)
        << refused.error().to_string();
    EXPECT_EQ(backend->in_flight_count(), 0u);
    for (int i = 0; i < 4; ++i) expect_untouched(i);
    auto accepted = backend->submit(std::span<Request* const>(ptrs_, 4));
    ASSERT_TRUE(accepted.has_value()) << accepted.error().to_string();
    EXPECT_EQ(*accepted, 4u);
    EXPECT_EQ(reap_all(*backend), 4u);
    expect_each_written_once(script);
}

TEST_P(SubmitSyscall, EagainIsBusyWithRequestsInFlightAndAnErrorWithNone) {
    SubmitScript script;
    script.calls = {SubmitCall{1, 0}, SubmitCall{0, EAGAIN}, SubmitCall{0, EAGAIN}};
    script.call_count = 3;
    auto backend = make(script);
    if (!backend) {
        GTEST_SKIP() << GetParam() << " is not available here";
    }
    prepare_writes();
    auto accepted = backend->submit(std::span<Request* const>(ptrs_, 1));
    ASSERT_TRUE(accepted.has_value());
    EXPECT_EQ(*accepted, 1u);
    // Room will come back by reaping: busy.
    auto busy = backend->submit(std::span<Request* const>(ptrs_ + 1, 3));
    ASSERT_FALSE(busy.has_value());
    EXPECT_EQ(busy.error().code(), StatusCode::kBusy) << busy.error().to_string();
    for (int i = 1; i < 4; ++i) expect_untouched(i);
    EXPECT_EQ(reap_all(*backend), 1u);
    // Nothing in flight: waiting cannot help, so it is the error.
    auto refused = backend->submit(std::span<Request* const>(ptrs_ + 1, 3));
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code(), StatusCode::kIo) << refused.error().to_string();
    EXPECT_EQ(refused.error().errno_value(), EAGAIN);
    for (int i = 1; i < 4; ++i) expect_untouched(i);
    accepted = backend->submit(std::span<Request* const>(ptrs_ + 1, 3));
    ASSERT_TRUE(accepted.has_value());
    EXPECT_EQ(*accepted, 3u);
    EXPECT_EQ(reap_all(*backend), 3u);
    expect_each_written_once(script);
}

INSTANTIATE_TEST_SUITE_P(KernelSubmitBackends, SubmitSyscall,
                         ::testing::Values("io_uring", "libaio"));

TEST(MakeBackend, AutoPrefersIoUringAndExplainsNothingWhenItWorks) {
    BackendOptions o;
    o.kind = "auto";
    std::string why = "unset";
    auto b = make_backend(o, &why);
    ASSERT_TRUE(b.has_value()) << b.error().to_string();
    // Whatever it chose, every backend it passed over has a reason.
    if ((*b)->name() != "io_uring") {
        EXPECT_NE(why.find("io_uring"), std::string::npos) << why;
    } else {
        EXPECT_TRUE(why.empty()) << why;
    }
}

TEST(MakeBackend, UnknownKindIsAnError) {
    BackendOptions o;
    o.kind = "spdk";
    auto b = make_backend(o, nullptr);
    ASSERT_FALSE(b.has_value());
    EXPECT_EQ(b.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(b.error().message().find("spdk"), std::string::npos);
}

}  // namespace
}  // namespace zinf::io::test
