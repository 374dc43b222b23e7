// No allocation on the hot path: once the trace is recorded, iterations of acquire / release
// with prefetch and eviction (on the MemoryMover and an inline CpuDevice) call operator new zero
// times. Counts every global operator new of the process while armed.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "src/device/cpu_device.h"
#include "src/tier/residency_manager.h"
#include "tests/tier/memory_mover.h"

// GCC sees malloc behind operator new and free behind operator delete once both are inlined,
// and warns that they do not match; here they do, by construction.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<bool> g_armed{false};
std::atomic<std::uint64_t> g_news{0};

void* counted_alloc(std::size_t size) {
    if (g_armed.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(size == 0 ? 1 : size);
}
}  // namespace

void* operator new(std::size_t size) {
    if (void* p = counted_alloc(size)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
    if (void* p = counted_alloc(size)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    return counted_alloc(size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return counted_alloc(size);
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete[](void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
    std::free(p);
}

namespace zinf::tier {
namespace {

TEST(ResidencySteadyState, IterationsAfterTheTraceAllocateNothing) {
    constexpr std::size_t kPart = 4096;
    ResidencyOptions o;
    o.device_budget_bytes = 4 * kPart;
    o.host_budget_bytes = 4 * kPart;
    o.prefetch_bucket_numel = 3 * kPart / 2;
    o.partition_capacity = 16;
    auto device =
        device::CpuDevice::create({.budget_bytes = 1 << 20, .worker_thread = false}).value();
    fake::MemoryMover mover(o.host_budget_bytes, 7, 8);
    auto rm = ResidencyManager::create(o, mover, device.get()).value();
    for (PartitionId i = 0; i < 12; ++i)
        ASSERT_TRUE(rm->register_partition(i, kPart, DType::kFloat16, Tier::kNvme).is_ok());
    auto iteration = [&](bool write) {
        rm->begin_iteration();
        for (PartitionId i = 0; i < 12; ++i) {
            const Tier tier = i % 4 == 3 ? Tier::kHost : Tier::kDevice;
            auto r = rm->acquire(i, tier);
            ASSERT_TRUE(r.has_value());
            static_cast<std::byte*>(*r)[0] = std::byte{1};
            rm->release(i, write && i % 3 == 0);
        }
        rm->end_iteration();
    };
    iteration(true);  // records the trace (allocates once)
    iteration(true);
    g_news = 0;
    g_armed = true;
    for (int k = 0; k < 20; ++k) iteration(k % 2 == 0);
    g_armed = false;
    EXPECT_EQ(g_news.load(), 0u);
    const ResidencyStats s = rm->stats();
    EXPECT_GT(s.drops, 0u);
    EXPECT_GT(s.write_backs + s.bytes_swapped_out, 0u);
    EXPECT_GT(s.prefetches_started, 0u);
}

}  // namespace
}  // namespace zinf::tier
