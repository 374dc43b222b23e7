// CudaDevice: budget, streams and events, copies through registered host memory, device
// selection. Label gpu: the tests that need a GPU skip themselves without one; the no-GPU error
// paths run everywhere.
#include "src/device/cuda_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cuda/elementwise.h"
#include "src/base/aligned.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace zinf::device {
namespace {

Result<std::unique_ptr<CudaDevice>> make_device(std::size_t budget_bytes = std::size_t{64} << 20) {
    CudaDeviceOptions options;
    options.budget_bytes = budget_bytes;
    options.event_count_max = 8;
    options.stream_count_max = 2;
    return CudaDevice::create(options);
}

TEST(CudaDeviceTest, CreateWithoutGpuFailsWithTheProbeMessage) {
    if (CudaDevice::probe().is_ok()) GTEST_SKIP() << "a CUDA device is present";
    auto device = make_device();
    ASSERT_FALSE(device.has_value());
    EXPECT_EQ(device.error().code(), StatusCode::kCuda);
    EXPECT_NE(device.error().message().find("no CUDA device: "), std::string::npos);
}

TEST(CudaDeviceTest, LocalRankFromEnvironment) {
    ::setenv("LOCAL_RANK", "3", 1);
    EXPECT_EQ(CudaDevice::local_rank_from_environment(), 3);
    ::setenv("LOCAL_RANK", "x", 1);
    ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    EXPECT_EQ(CudaDevice::local_rank_from_environment(), 1);
    ::unsetenv("LOCAL_RANK");
    ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    EXPECT_EQ(CudaDevice::local_rank_from_environment(), 0);
}

TEST(CudaDeviceTest, NameKindAndRankOutOfRange) {
    ZINF_SKIP_WITHOUT_CUDA();
    auto device = make_device();
    ASSERT_TRUE(device.has_value()) << device.error().to_string();
    EXPECT_EQ((*device)->kind(), DeviceKind::kCuda);
    EXPECT_EQ((*device)->name().rfind("cuda:0 (", 0), 0u) << (*device)->name();
    CudaDeviceOptions options;
    options.local_rank = 1 << 20;
    auto bad = CudaDevice::create(options);
    ASSERT_FALSE(bad.has_value());
    EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
}

TEST(CudaDeviceTest, AllocationsAreHeldToTheBudget) {
    ZINF_SKIP_WITHOUT_CUDA();
    auto made = make_device(std::size_t{8} << 20);
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    CudaDevice& device = **made;
    auto a = device.allocate(std::size_t{6} << 20, "test");
    ASSERT_TRUE(a.has_value());
    auto b = device.allocate(std::size_t{3} << 20, "test");
    ASSERT_FALSE(b.has_value());
    EXPECT_EQ(b.error().code(), StatusCode::kNoSpace);
    EXPECT_NE(b.error().message().find("budget"), std::string::npos) << b.error().message();
    EXPECT_NE(b.error().message().find("cuda:0"), std::string::npos) << b.error().message();
    EXPECT_EQ(device.used_bytes(), std::size_t{6} << 20);
    device.free(*a);
    device.free(nullptr);
    EXPECT_EQ(device.used_bytes(), 0u);
    EXPECT_EQ(device.peak_bytes(), std::size_t{6} << 20);
}

TEST(CudaDeviceTest, CopiesRoundTripThroughRegisteredMemoryOnSeveralStreams) {
    ZINF_SKIP_WITHOUT_CUDA();
    auto made = make_device();
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    CudaDevice& device = **made;
    auto stream = device.create_stream();
    ASSERT_TRUE(stream.has_value());
    for (std::size_t size : {std::size_t{1}, std::size_t{15}, (std::size_t{1} << 20) + 3}) {
        SCOPED_TRACE(size);
        auto host = AlignedBuffer::allocate(size);
        auto back = AlignedBuffer::allocate(size);
        ASSERT_TRUE(host.has_value());
        ASSERT_TRUE(back.has_value());
        for (std::size_t i = 0; i < size; ++i) host->data()[i] = static_cast<std::byte>(i * 7 + 1);
        ASSERT_TRUE(device.register_host_memory(host->span()).is_ok());
        ASSERT_TRUE(device.register_host_memory(back->span()).is_ok());
        EXPECT_EQ(device.register_host_memory(host->span()).code(), StatusCode::kInvalidArgument);
        auto d1 = device.allocate(size, "test");
        auto d2 = device.allocate(size, "test");
        ASSERT_TRUE(d1.has_value());
        ASSERT_TRUE(d2.has_value());
        // Upload on stream 0, then copy and download on the new stream after an event.
        ASSERT_TRUE(device.copy_to_device(*d1, host->data(), size, 0).is_ok());
        auto uploaded = device.record_event(0);
        ASSERT_TRUE(uploaded.has_value());
        ASSERT_TRUE(device.stream_wait_event(*stream, *uploaded).is_ok());
        ASSERT_TRUE(device.fill_zero(*d2, size, *stream).is_ok());
        ASSERT_TRUE(device.copy_on_device(*d2, *d1, size, *stream).is_ok());
        ASSERT_TRUE(device.copy_to_host(back->data(), *d2, size, *stream).is_ok());
        auto downloaded = device.record_event(*stream);
        ASSERT_TRUE(downloaded.has_value());
        ASSERT_TRUE(device.synchronize_event(*downloaded).is_ok());
        auto done = device.event_done(*downloaded);
        ASSERT_TRUE(done.has_value());
        EXPECT_TRUE(*done);
        EXPECT_EQ(std::memcmp(host->data(), back->data(), size), 0);
        device.release_event(*uploaded);
        device.release_event(*downloaded);
        device.free(*d1);
        device.free(*d2);
        ASSERT_TRUE(device.unregister_host_memory(host->data()).is_ok());
        ASSERT_TRUE(device.unregister_host_memory(back->data()).is_ok());
        EXPECT_EQ(device.unregister_host_memory(back->data()).code(), StatusCode::kInvalidArgument);
    }
}

// A query that finds the event not reached yet must leave no error behind: kernel launches
// check cudaGetLastError, and the residency manager polls in-flight prefetches between them.
TEST(CudaDeviceTest, AnEventNotYetReachedLeavesNoErrorBehind) {
    ZINF_SKIP_WITHOUT_CUDA();
    const std::size_t size = std::size_t{256} << 20;
    auto made = make_device(2 * size);
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    CudaDevice& device = **made;
    auto a = device.allocate(size, "test");
    auto b = device.allocate(size, "test");
    ASSERT_TRUE(a.has_value() && b.has_value());
    bool saw_not_done = false;
    for (int attempt = 0; attempt < 8 && !saw_not_done; ++attempt) {
        // Enough device work (tens of milliseconds) that the event is not reached at once.
        for (int i = 0; i < 32 * (attempt + 1); ++i) {
            ASSERT_TRUE(device.copy_on_device(*b, *a, size, 0).is_ok());
            ASSERT_TRUE(device.copy_on_device(*a, *b, size, 0).is_ok());
        }
        auto event = device.record_event(0);
        ASSERT_TRUE(event.has_value());
        auto done = device.event_done(*event);
        ASSERT_TRUE(done.has_value()) << done.error().to_string();
        if (!*done) {
            saw_not_done = true;
            EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess)
                << cudaGetErrorString(cudaPeekAtLastError());
            // A launch after the query succeeds (it checks cudaGetLastError).
            ASSERT_TRUE(device.fill_zero(*b, size, 0).is_ok());
            float* x = static_cast<float*>(*a);
            EXPECT_TRUE(kernels::cuda::scale(x, 1024, 2.0f, device.cuda_stream(0)).is_ok());
        }
        ASSERT_TRUE(device.synchronize_event(*event).is_ok());
        device.release_event(*event);
    }
    EXPECT_TRUE(saw_not_done) << "every event was already reached when queried";
    device.free(*a);
    device.free(*b);
}

TEST(CudaDeviceTest, TablesAreBoundedAndReportIt) {
    ZINF_SKIP_WITHOUT_CUDA();
    auto made = make_device();
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    CudaDevice& device = **made;
    ASSERT_TRUE(device.create_stream().has_value());
    ASSERT_TRUE(device.create_stream().has_value());
    auto third = device.create_stream();
    ASSERT_FALSE(third.has_value());
    EXPECT_EQ(third.error().code(), StatusCode::kNoSpace);
    std::vector<EventId> events;
    for (int i = 0; i < 8; ++i) {
        auto e = device.record_event(0);
        ASSERT_TRUE(e.has_value());
        events.push_back(*e);
    }
    auto ninth = device.record_event(0);
    ASSERT_FALSE(ninth.has_value());
    EXPECT_EQ(ninth.error().code(), StatusCode::kBusy);
    for (EventId e : events) device.release_event(e);
    EXPECT_TRUE(device.synchronize(0).is_ok());
}

}  // namespace
}  // namespace zinf::device
