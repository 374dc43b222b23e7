// CpuDevice: budget accounting, copies through the worker FIFO and inline, events.
#include "src/device/cpu_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <vector>

namespace zinf::device {
namespace {

TEST(CpuDevice, AllocationIsHeldToTheBudget) {
    auto device = CpuDevice::create({.budget_bytes = 64 * 1024}).value();
    auto a = device->allocate(40 * 1024, "test");
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(device->used_bytes(), 40u * 1024);
    auto b = device->allocate(32 * 1024, "test");
    ASSERT_FALSE(b.has_value());
    EXPECT_EQ(b.error().code(), StatusCode::kNoSpace);
    EXPECT_NE(b.error().message().find("budget"), std::string::npos);
    auto c = device->allocate(1, "test");  // rounded up to one 4 KiB unit
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(device->used_bytes(), 44u * 1024);
    device->free(*a);
    device->free(*c);
    EXPECT_EQ(device->used_bytes(), 0u);
    EXPECT_EQ(device->peak_bytes(), 44u * 1024);
    device->free(nullptr);
}

TEST(CpuDevice, BudgetErrorNamesTheAllocationAndWhatHoldsTheMemory) {
    auto device = CpuDevice::create({.budget_bytes = 64 * 1024}).value();
    void* a = device->allocate(24 * 1024, "zero: parameters").value();
    void* b = device->allocate(16 * 1024, "mlp: activations").value();
    void* c = device->allocate(8 * 1024, "zero: parameters").value();
    auto d = device->allocate(32 * 1024, "zero: fp32 scratch");
    ASSERT_FALSE(d.has_value());
    const std::string& m = d.error().message();
    EXPECT_NE(m.find("32768 bytes for zero: fp32 scratch"), std::string::npos) << m;
    EXPECT_NE(m.find("budget of 65536 bytes"), std::string::npos) << m;
    // Labels summed, largest first.
    EXPECT_NE(m.find("49152 bytes in use: 49152 bytes in 3 allocations: 32768 zero: parameters, "
                     "16384 mlp: activations"),
              std::string::npos)
        << m;
    device->free(a);
    device->free(b);
    device->free(c);
}

// An error path may free memory right after queueing a fill on it (as a failed engine set-up
// does): free waits for the queued work, as cudaFree does, instead of letting the worker write
// to unmapped pages. Large enough that the allocation is its own mapping, which free unmaps.
TEST(CpuDevice, FreeWaitsForWorkQueuedOnTheMemory) {
    constexpr std::size_t kBytes = 64u << 20;
    auto device =
        CpuDevice::create({.budget_bytes = kBytes, .op_delay = std::chrono::milliseconds(50)})
            .value();
    for (int i = 0; i < 3; ++i) {
        void* d = device->allocate(kBytes, "test").value();
        ASSERT_TRUE(device->fill_zero(d, kBytes, 0).is_ok());
        device->free(d);  // the fill has not started yet: op_delay holds it back
        EXPECT_EQ(device->used_bytes(), 0u);
    }
    std::vector<std::byte> host(4096);
    void* d = device->allocate(host.size(), "test").value();
    ASSERT_TRUE(device->copy_to_device(d, host.data(), host.size(), 0).is_ok());
    EXPECT_EQ(device->bytes_copied(), 0u);  // still queued behind op_delay
    device->free(d);
    EXPECT_EQ(device->bytes_copied(), host.size());  // free ran it first
}

class CpuDeviceModes : public ::testing::TestWithParam<bool> {};

TEST_P(CpuDeviceModes, CopiesRoundTripInOrder) {
    auto device = CpuDevice::create({.budget_bytes = 1 << 20, .worker_thread = GetParam()}).value();
    const std::size_t n = 100000;
    std::vector<std::byte> host(n), back(n, std::byte{0});
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<std::byte>(i * 7 + 3);
    void* d1 = device->allocate(n, "test").value();
    void* d2 = device->allocate(n, "test").value();
    const StreamId s = device->create_stream().value();
    ASSERT_TRUE(device->copy_to_device(d1, host.data(), n, s).is_ok());
    ASSERT_TRUE(device->copy_on_device(d2, d1, n, s).is_ok());
    ASSERT_TRUE(device->fill_zero(d1, n / 2, s).is_ok());
    ASSERT_TRUE(device->copy_to_host(back.data(), d2, n, s).is_ok());
    const EventId e = device->record_event(s).value();
    ASSERT_TRUE(device->synchronize_event(e).is_ok());
    EXPECT_TRUE(device->event_done(e).value());
    device->release_event(e);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n), 0);
    ASSERT_TRUE(device->copy_to_host(back.data(), d1, n, 0).is_ok());
    ASSERT_TRUE(device->synchronize(0).is_ok());
    for (std::size_t i = 0; i < n / 2; ++i) ASSERT_EQ(back[i], std::byte{0});
    EXPECT_EQ(back[n / 2], host[n / 2]);
    EXPECT_EQ(device->bytes_copied(), 4u * n);
    device->free(d1);
    device->free(d2);
}

TEST_P(CpuDeviceModes, ManySmallCopiesThroughAFullQueue) {
    auto device = CpuDevice::create({.budget_bytes = 1 << 20,
                                     .worker_thread = GetParam(),
                                     .queue_capacity = 4,
                                     .event_capacity = 8})
                      .value();
    std::vector<std::uint32_t> host(4096);
    std::iota(host.begin(), host.end(), 0u);
    auto* d = static_cast<std::uint32_t*>(device->allocate(host.size() * 4, "test").value());
    for (std::size_t i = 0; i < host.size(); i += 16) {
        ASSERT_TRUE(device->copy_to_device(d + i, host.data() + i, 64, 0).is_ok());
    }
    std::vector<std::uint32_t> back(host.size());
    ASSERT_TRUE(device->copy_to_host(back.data(), d, back.size() * 4, 0).is_ok());
    ASSERT_TRUE(device->synchronize(0).is_ok());
    EXPECT_EQ(back, host);
    // The event table is fixed: running out is kBusy, releasing makes room.
    std::vector<EventId> events;
    for (int i = 0; i < 8; ++i) events.push_back(device->record_event(0).value());
    auto extra = device->record_event(0);
    ASSERT_FALSE(extra.has_value());
    EXPECT_EQ(extra.error().code(), StatusCode::kBusy);
    for (EventId e : events) device->release_event(e);
    EXPECT_TRUE(device->record_event(0).has_value());
    device->free(d);
}

INSTANTIATE_TEST_SUITE_P(WorkerOrInline, CpuDeviceModes, ::testing::Values(true, false));

TEST(CpuDevice, HostRegistration) {
    auto device = CpuDevice::create({}).value();
    std::vector<std::byte> region(8192);
    ASSERT_TRUE(device->register_host_memory(region).is_ok());
    EXPECT_FALSE(device->register_host_memory(region).is_ok());
    ASSERT_TRUE(device->unregister_host_memory(region.data()).is_ok());
    EXPECT_EQ(device->unregister_host_memory(region.data()).code(), StatusCode::kNotFound);
}

TEST(CpuDeviceDeathTest, CopyOutsideAnAllocationAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // the device runs a worker thread
    auto device = CpuDevice::create({.budget_bytes = 1 << 20}).value();
    void* d = device->allocate(4096, "test").value();
    std::vector<std::byte> host(8192);
    EXPECT_DEATH((void)device->copy_to_device(d, host.data(), 8192, 0), "device allocation");
    device->free(d);
}

}  // namespace
}  // namespace zinf::device
