// ChunkLoop: sizing the oneTBB arena the CPU kernels run in.
#include "kernels/chunk_loop.h"

#include "src/base/log.h"

namespace zinf::kernels {

Result<ChunkLoop> ChunkLoop::create(int threads) {
    if (threads < 0)
        return Status::invalid_argument(str_cat("threads: expected >= 0, got ", threads));
    const int count = threads == 0 ? tbb::this_task_arena::max_concurrency() : threads;
    ZINF_ASSERT_GE(count, 1);
    if (count == 1) return ChunkLoop(nullptr, 1);
    // One slot is reserved for the caller, who joins the work in execute(). oneTBB caps its
    // workers at the machine's concurrency unless a tbb::global_control raises the cap, so more
    // threads than cores are honoured only then (tests do it to run 7 threads on 2 cores).
    return ChunkLoop(std::make_unique<tbb::task_arena>(count, 1), count);
}

}  // namespace zinf::kernels
