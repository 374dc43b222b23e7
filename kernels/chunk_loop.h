// ChunkLoop: the oneTBB parallel loop the CPU kernels run in, over fixed-size chunks on a fixed
// number of threads. Public so that benchmarks measure their baselines with the same loop.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <memory>

#include "src/base/status.h"

namespace zinf::kernels {

// Elements per chunk, the unit of scheduled work: 16 Ki elements is 64 KiB of each fp32
// stream, so the 4-7 streams of an optimizer step fit in a core's L2 while a chunk is updated,
// and 256 M parameters still give 16 Ki chunks to balance across threads. Results never depend
// on it except through the documented summation order of reductions.
inline constexpr std::size_t kChunkNumel = std::size_t{16} * 1024;

inline constexpr std::size_t chunk_count_for(std::size_t numel) noexcept {
    return (numel + kChunkNumel - 1) / kChunkNumel;
}

class ChunkLoop {
public:
    // A loop on `threads` threads, the caller's included; 0 means every core oneTBB sees.
    // Returns kInvalidArgument for a negative count. Allocates the arena (threads start lazily,
    // on the first run).
    static Result<ChunkLoop> create(int threads);

    ChunkLoop(ChunkLoop&&) noexcept = default;
    ChunkLoop& operator=(ChunkLoop&&) noexcept = default;
    ChunkLoop(const ChunkLoop&) = delete;
    ChunkLoop& operator=(const ChunkLoop&) = delete;
    ~ChunkLoop() = default;

    int threads() const noexcept { return threads_; }

    // Calls body(chunk_index) once for every index in [0, chunk_count), in any order and on
    // any of the loop's threads; returns when all calls have returned. Blocks the caller,
    // which takes part. `body` must not throw. Callable from one thread at a time per loop.
    // oneTBB recycles its task objects, so a steady state allocates nothing here.
    template <typename Body>
    void run(std::size_t chunk_count, const Body& body) const {
        if (threads_ == 1 || chunk_count <= 1) {
            for (std::size_t i = 0; i < chunk_count; ++i) body(i);
            return;
        }
        arena_->execute([&] {
            tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunk_count, 1),
                              [&](const tbb::blocked_range<std::size_t>& range) {
                                  for (std::size_t i = range.begin(); i != range.end(); ++i)
                                      body(i);
                              });
        });
    }

private:
    ChunkLoop(std::unique_ptr<tbb::task_arena> arena, int threads) noexcept
        : arena_(std::move(arena)), threads_(threads) {}

    std::unique_ptr<tbb::task_arena> arena_;  // null when threads_ == 1
    int threads_ = 1;
};

}  // namespace zinf::kernels
