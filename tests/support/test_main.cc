// gtest main for every test binary: prints the seed so that a failure can be replayed with
// ZINF_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/support/test_seed.h"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    std::printf("[zinf test] seed %llu (replay with ZINF_TEST_SEED=%llu)\n",
                static_cast<unsigned long long>(zinf::test::seed()),
                static_cast<unsigned long long>(zinf::test::seed()));
    return RUN_ALL_TESTS();
}
