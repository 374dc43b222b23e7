// SimDevice / SimBackend: out-of-order completion reproducible by seed, capacity as ENOSPC.
#include "io/sim_backend.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/io/io_test_util.h"

namespace zinf::io::test {
namespace {

std::vector<int> completion_order(std::uint64_t seed) {
    SimOptions o;
    o.seed = seed;
    o.latency_us_min = 0;
    o.latency_us_max = 1000;
    SimDevice device(o);
    FileOptions fo;
    fo.create = true;
    const int file = *device.open("f", fo);
    SimBackend backend(device, 16, 0);
    std::vector<std::byte> buffer(16 * 512);
    Request reqs[16];
    Request* ptrs[16];
    std::vector<int> order;
    for (int i = 0; i < 16; ++i) {
        reqs[i].op = OpKind::kWrite;
        reqs[i].fd = file;
        reqs[i].offset_bytes = static_cast<std::uint64_t>(i) * 512;
        reqs[i].length_bytes = 512;
        reqs[i].buffer = buffer.data() + i * 512;
        reqs[i].user = &order;
        reqs[i].callback = [](Request& r, const Status& s) {
            EXPECT_TRUE(s.is_ok());
            static_cast<std::vector<int>*>(r.user)->push_back(
                static_cast<int>(r.offset_bytes / 512));
        };
        ptrs[i] = &reqs[i];
    }
    auto n = backend.submit(std::span<Request* const>(ptrs, 16));
    EXPECT_EQ(*n, 16u);
    // Let everything fall due, so that the order depends on the seed alone.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    auto reaped = backend.reap(16, std::chrono::seconds(5));
    EXPECT_EQ(*reaped, 16u);
    return order;
}

TEST(SimBackend, OutOfOrderCompletionIsReproducibleBySeed) {
    const std::uint64_t seed = zinf::test::seed();
    const auto first = completion_order(seed);
    ASSERT_EQ(first.size(), 16u);
    EXPECT_EQ(completion_order(seed), first);
    std::vector<int> in_order(16);
    for (int i = 0; i < 16; ++i) in_order[i] = i;
    EXPECT_NE(first, in_order) << "16 requests with random latency completed in submission order";
    EXPECT_NE(completion_order(seed + 1), first);
}

TEST(SimBackend, CapacityGivesNoSpaceWithContext) {
    EngineOptions o;
    SimOptions sim;
    sim.capacity_bytes = 1 << 20;
    o.sim = sim;
    auto engine = Engine::create(o);
    ASSERT_TRUE(engine.has_value());
    FileOptions fo;
    fo.create = true;
    auto file = (*engine)->open("cap", fo);
    ASSERT_TRUE(file.has_value());
    AlignedBuffer buf = must_allocate(2 << 20);
    const Status st = (*engine)->write(*file, 0, buf.span());
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.to_string();
    EXPECT_NE(st.message().find("write cap offset"), std::string::npos) << st.to_string();
    // Preallocating beyond the capacity fails up front.
    fo.preallocate_bytes = 4 << 20;
    auto big = (*engine)->open("big", fo);
    ASSERT_FALSE(big.has_value());
    EXPECT_EQ(big.error().code(), StatusCode::kNoSpace);
}

TEST(SimBackend, ManyEnginesRunFast) {
    // The layers above run hundreds of sim tests; one engine's life must be cheap.
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i) {
        EngineOptions o;
        o.sim = SimOptions{};
        o.sim->latency_us_max = 20;
        auto engine = Engine::create(o);
        ASSERT_TRUE(engine.has_value());
        FileOptions fo;
        fo.create = true;
        auto file = (*engine)->open("x", fo);
        ASSERT_TRUE(file.has_value());
        AlignedBuffer buf = must_allocate(64 * 1024);
        ASSERT_TRUE((*engine)->write(*file, 0, buf.span()).is_ok());
        ASSERT_TRUE((*engine)->read(*file, 0, buf.span()).is_ok());
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace zinf::io::test
