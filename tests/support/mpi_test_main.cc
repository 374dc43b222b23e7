// gtest main for tests run under mpiexec: initialises MPI, runs the tests on every rank, and
// fails every rank when any rank failed (so that mpiexec's exit code says it). Every rank prints
// its results (a failure is shown where it happened).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/support/test_seed.h"
#include "zero/mpi_communicator.h"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    auto session = zinf::zero::MpiSession::init(&argc, &argv);
    if (!session.has_value()) {
        std::fprintf(stderr, "MPI: %s\n", session.error().to_string().c_str());
        return 1;
    }
    const int rank = (*session)->rank();
    if (rank == 0) {
        std::printf("[zinf test] %d ranks, seed %llu (replay with ZINF_TEST_SEED=%llu)\n",
                    (*session)->world_size(), static_cast<unsigned long long>(zinf::test::seed()),
                    static_cast<unsigned long long>(zinf::test::seed()));
    }
    const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    if (failed != 0) std::fprintf(stderr, "[zinf test] rank %d: FAILED\n", rank);
    return zinf::zero::mpi_any_failed(failed != 0) ? 1 : 0;
}
