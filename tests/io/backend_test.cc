// Backend-level contract, on each system backend directly: the queue-full answer, completion
// callbacks, end of file, registered buffers and files, make_backend's choices.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "io/backend.h"
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
    EXPECT_NE(c.status.message().find("unexpected end of file"), std::string::npos) << c.status.to_string();
    EXPECT_EQ(r.done_bytes, 100u);
}

TEST_P(BackendDirect, BadDescriptorIsAnErrorNotAHang) {
    Request r;
    Completion c;
    prepare(r, c, OpKind::kRead, 0, 4096, buffer_.data());
    r.fd = 1000000;  // never open
    Request* p = &r;
    auto accepted = backend_->submit(std::span<Request* const>(&p, 1));
    ASSERT_TRUE(accepted.has_value());
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
