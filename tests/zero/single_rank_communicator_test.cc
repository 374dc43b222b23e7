// SingleRankCommunicator on the CPU device: every collective of one rank is its input.
#include "zero/single_rank_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "src/device/cpu_device.h"

namespace zinf::zero {
namespace {

TEST(SingleRankCommunicatorTest, CollectivesCopyOrLeaveInPlace) {
    device::CpuDeviceOptions options;
    options.budget_bytes = 1 << 20;
    options.worker_thread = false;
    auto made = device::CpuDevice::create(options);
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    Device& device = **made;
    SingleRankCommunicator comm(device);
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.world_size(), 1);
    EXPECT_EQ(comm.name(), "single-rank");

    const std::size_t n = 1027;
    auto send = device.allocate(n * sizeof(float), "test");
    auto recv = device.allocate(n * sizeof(float), "test");
    ASSERT_TRUE(send.has_value());
    ASSERT_TRUE(recv.has_value());
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f;
    ASSERT_TRUE(device.copy_to_device(*send, host.data(), n * sizeof(float), 0).is_ok());

    auto check = [&](void* buffer) {
        std::vector<float> back(n, -1.0f);
        ASSERT_TRUE(device.copy_to_host(back.data(), buffer, n * sizeof(float), 0).is_ok());
        ASSERT_TRUE(device.synchronize(0).is_ok());
        EXPECT_EQ(back, host);
    };
    ASSERT_TRUE(device.fill_zero(*recv, n * sizeof(float), 0).is_ok());
    ASSERT_TRUE(comm.all_gather(*send, *recv, n, DType::kFloat32, 0).is_ok());
    check(*recv);
    ASSERT_TRUE(device.fill_zero(*recv, n * sizeof(float), 0).is_ok());
    ASSERT_TRUE(comm.reduce_scatter(*send, *recv, n, DType::kFloat32, ReduceOp::kSum, 0).is_ok());
    check(*recv);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        ASSERT_TRUE(device.fill_zero(*recv, n * sizeof(float), 0).is_ok());
        ASSERT_TRUE(comm.all_reduce(*send, *recv, n, DType::kFloat32, op, 0).is_ok());
        check(*recv);
        ASSERT_TRUE(comm.all_reduce(*send, *send, n, DType::kFloat32, op, 0).is_ok());
        check(*send);
    }
    ASSERT_TRUE(comm.broadcast(*send, n, DType::kFloat32, 0, 0).is_ok());
    check(*send);
    EXPECT_TRUE(comm.barrier().is_ok());
    device.free(*send);
    device.free(*recv);
}

}  // namespace
}  // namespace zinf::zero
