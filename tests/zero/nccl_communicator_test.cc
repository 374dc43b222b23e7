// NcclCommunicator with a world of one rank on one GPU (no MPI), and the single-rank
// communicator on the CUDA device: the results every collective must give with one rank.
// Label gpu: the GPU tests skip themselves without a GPU; the reduction mapping runs anywhere.
#include "zero/nccl_communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "src/device/cuda_device.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "zero/detail/nccl_ops.h"
#include "zero/single_rank_communicator.h"

namespace zinf::zero {
namespace {

class OneRankTest : public ::testing::Test {
protected:
    void SetUp() override {
        ZINF_SKIP_WITHOUT_CUDA();
        device::CudaDeviceOptions options;
        options.budget_bytes = std::size_t{64} << 20;
        auto made = device::CudaDevice::create(options);
        ASSERT_TRUE(made.has_value()) << made.error().to_string();
        device_ = std::move(made).value();
    }

    // Runs every collective of `comm` over fp32 and bf16 data and checks the one-rank results.
    void check_collectives(Communicator& comm) {
        ASSERT_EQ(comm.world_size(), 1);
        ASSERT_EQ(comm.rank(), 0);
        auto stream = device_->create_stream();
        ASSERT_TRUE(stream.has_value());
        // Counts that are not multiples of any block or pack size, so that every kernel's tail
        // is checked: one larger than a GPU's worth of blocks, one smaller.
        for (const std::size_t n : {(std::size_t{1} << 20) + 3, std::size_t{37}})
            for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
                SCOPED_TRACE(testing::Message() << dtype_name(dtype) << ", " << n << " elements");
                const std::size_t bytes = n * dtype_size_bytes(dtype);
                std::vector<std::uint8_t> host(bytes);
                // Small integers are exact in bf16 and fp32 alike, so sums of one rank are exact.
                for (std::size_t i = 0; i < n; ++i) {
                    const float value = static_cast<float>(i % 251);
                    if (dtype == DType::kFloat32) {
                        std::memcpy(host.data() + i * 4, &value, 4);
                    } else {
                        const std::uint16_t b = test::ref_float_to_bf16(value);
                        std::memcpy(host.data() + i * 2, &b, 2);
                    }
                }
                auto send = device_->allocate(bytes, "test");
                auto recv = device_->allocate(bytes, "test");
                ASSERT_TRUE(send.has_value());
                ASSERT_TRUE(recv.has_value());
                ASSERT_TRUE(device_->copy_to_device(*send, host.data(), bytes, *stream).is_ok());
                std::vector<std::uint8_t> back(bytes);
                auto expect_equal = [&](void* buffer, const char* what) {
                    ASSERT_TRUE(device_->copy_to_host(back.data(), buffer, bytes, *stream).is_ok());
                    ASSERT_TRUE(device_->synchronize(*stream).is_ok());
                    if (back == host) return;
                    // Say where and how, not a dump of megabytes: the first differing element, the
                    // count, and whether the buffer still holds zeros (the operation never ran).
                    const std::size_t eb = dtype_size_bytes(dtype);
                    std::size_t first = n, count = 0, zeros = 0;
                    for (std::size_t i = 0; i < n; ++i) {
                        if (std::memcmp(back.data() + i * eb, host.data() + i * eb, eb) != 0) {
                            if (first == n) first = i;
                            ++count;
                        }
                        bool zero = true;
                        for (std::size_t b = 0; b < eb; ++b) zero = zero && back[i * eb + b] == 0;
                        zeros += zero ? 1 : 0;
                    }
                    ADD_FAILURE() << what << ": " << count << " of " << n
                                  << " elements differ, first at " << first << " (expected "
                                  << static_cast<float>(first % 251) << "); " << zeros
                                  << " elements are zero";
                };
                ASSERT_TRUE(device_->fill_zero(*recv, bytes, *stream).is_ok());
                ASSERT_TRUE(comm.all_gather(*send, *recv, n, dtype, *stream).is_ok());
                expect_equal(*recv, "all_gather");
                for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
                    SCOPED_TRACE(op == ReduceOp::kSum   ? "sum"
                                 : op == ReduceOp::kAvg ? "avg"
                                                        : "max");
                    ASSERT_TRUE(device_->fill_zero(*recv, bytes, *stream).is_ok());
                    ASSERT_TRUE(comm.reduce_scatter(*send, *recv, n, dtype, op, *stream).is_ok());
                    expect_equal(*recv, "reduce_scatter");
                    ASSERT_TRUE(device_->fill_zero(*recv, bytes, *stream).is_ok());
                    ASSERT_TRUE(comm.all_reduce(*send, *recv, n, dtype, op, *stream).is_ok());
                    expect_equal(*recv, "all_reduce");
                    ASSERT_TRUE(comm.all_reduce(*send, *send, n, dtype, op, *stream).is_ok());
                    expect_equal(*send, "all_reduce in place");
                }
                ASSERT_TRUE(comm.broadcast(*send, n, dtype, 0, *stream).is_ok());
                expect_equal(*send, "broadcast");
                ASSERT_TRUE(comm.barrier().is_ok());
                device_->free(*send);
                device_->free(*recv);
            }
    }

    std::unique_ptr<device::CudaDevice> device_;
};

TEST_F(OneRankTest, NcclWorldOfOneWithoutMpi) {
    auto comm = NcclCommunicator::create_single_rank(*device_);
    ASSERT_TRUE(comm.has_value()) << comm.error().to_string();
    EXPECT_EQ((*comm)->name(), "nccl");
    check_collectives(**comm);
    EXPECT_TRUE((*comm)->check_async_error().is_ok());
}

TEST_F(OneRankTest, SingleRankCommunicatorOnTheCudaDevice) {
    SingleRankCommunicator comm(*device_);
    check_collectives(comm);
}

// A one-rank average is asked of NCCL as a sum (NCCL before 2.29.7 leaves the tail of a one-rank
// ncclAvg unwritten); with several ranks it stays ncclAvg. Needs no GPU.
TEST(NcclCommunicatorTest, OneRankAverageIsAskedAsASum) {
    EXPECT_EQ(detail::nccl_reduction(ReduceOp::kAvg, 1), ncclSum);
    EXPECT_EQ(detail::nccl_reduction(ReduceOp::kAvg, 2), ncclAvg);
    EXPECT_EQ(detail::nccl_reduction(ReduceOp::kSum, 1), ncclSum);
    EXPECT_EQ(detail::nccl_reduction(ReduceOp::kMax, 1), ncclMax);
    EXPECT_EQ(detail::nccl_reduction(ReduceOp::kMax, 8), ncclMax);
    EXPECT_EQ(detail::nccl_type(DType::kBFloat16), ncclBfloat16);
    EXPECT_EQ(detail::nccl_type(DType::kFloat16), ncclFloat16);
    EXPECT_EQ(detail::nccl_type(DType::kFloat32), ncclFloat32);
}

TEST(NcclCommunicatorTest, RejectsARankOutsideTheWorld) {
    ZINF_SKIP_WITHOUT_CUDA();
    auto device = device::CudaDevice::create({});
    ASSERT_TRUE(device.has_value()) << device.error().to_string();
    auto comm = NcclCommunicator::create(**device, NcclUniqueId{}, 2, 2);
    ASSERT_FALSE(comm.has_value());
    EXPECT_EQ(comm.error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::zero
