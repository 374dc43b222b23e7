// create_training_stack: one rank runs on the single-rank communicator; several ranks need the
// transport of their device, and a build or a process without it gets an error naming what is
// missing, not a stack that hangs in its first collective.
#include "src/engine/launch_stack.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/engine/engine_test_support.h"

namespace zinf {
namespace {

TEST(LaunchStack, OneRankRunsOnTheSingleRankCommunicator) {
    const auto config = test_support::load_config(test_support::small_config());
    auto stack = create_training_stack(config, Launch{});
    ASSERT_TRUE(stack.has_value()) << stack.error().to_string();
    EXPECT_EQ(stack->device->kind(), DeviceKind::kCpu);
    EXPECT_EQ(stack->communicator->world_size(), 1);
    EXPECT_EQ(stack->communicator->rank(), 0);
    ASSERT_NE(stack->engine, nullptr);
}

TEST(LaunchStack, SeveralCpuRanksNeedMpiStarted) {
    const auto config = test_support::load_config(test_support::small_config());
    Launch launch;
    launch.world_size = 2;
    launch.source = "environment";
    auto stack = create_training_stack(config, launch);
    ASSERT_FALSE(stack.has_value());
#ifdef ZINF_TEST_HAVE_MPI
    // Built with MPI, but this process was not started by mpirun: MPI is not initialised.
    EXPECT_EQ(stack.error().code(), StatusCode::kInvalidArgument) << stack.error().to_string();
    EXPECT_NE(stack.error().message().find("MPI is not initialised"), std::string::npos)
        << stack.error().to_string();
#else
    EXPECT_EQ(stack.error().code(), StatusCode::kNotSupported) << stack.error().to_string();
    EXPECT_NE(stack.error().message().find("built without MPI"), std::string::npos)
        << stack.error().to_string();
#endif
}

TEST(LaunchStack, CudaDeviceTypeWithoutCudaIsNotSupported) {
#ifdef ZINF_TEST_HAVE_CUDA
    GTEST_SKIP() << "CUDA is built here: tests/engine/cuda_engine_test.cc covers the GPU stack";
#else
    // A CPU optimizer: device.type cuda refuses offload_optimizer "none" in the config.
    const auto config =
        test_support::load_config(test_support::small_config(R"("zero_optimization": {"stage": 1,
          "offload_optimizer": {"device": "cpu"}},)"),
                                  {"device.type=cuda"});
    auto stack = create_training_stack(config, Launch{});
    ASSERT_FALSE(stack.has_value());
    EXPECT_EQ(stack.error().code(), StatusCode::kNotSupported) << stack.error().to_string();
    EXPECT_NE(stack.error().message().find("built without CUDA"), std::string::npos)
        << stack.error().to_string();
#endif
}

}  // namespace
}  // namespace zinf
