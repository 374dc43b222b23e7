// Helpers shared by the swap tests: engines on the simulated device or on real files, random
// bytes, and a child process running this same test binary (for locks and kill -9).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "io/engine.h"
#include "io/fault.h"

namespace zinf::swap::test {

// An engine on the simulated device, completing out of order with small random latencies.
inline std::unique_ptr<io::Engine> make_sim_engine(
    std::uint64_t seed, std::optional<io::FaultPlan> faults = std::nullopt, int threads = 2) {
    io::EngineOptions options;
    options.aio.intra_op_parallelism = threads;
    options.aio.block_size_bytes = 64 * 1024;
    options.aio.queue_depth = 16;
    io::SimOptions sim;
    sim.seed = seed;
    sim.latency_us_min = 0;
    sim.latency_us_max = 30;
    options.sim = sim;
    options.faults = faults;
    auto engine = io::Engine::create(options);
    EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
    return engine.has_value() ? std::move(*engine) : nullptr;
}

// An engine on the file system (aio.backend auto).
inline std::unique_ptr<io::Engine> make_file_engine() {
    io::EngineOptions options;
    options.aio.intra_op_parallelism = 1;
    options.aio.block_size_bytes = 256 * 1024;
    auto engine = io::Engine::create(options);
    EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
    return engine.has_value() ? std::move(*engine) : nullptr;
}

inline void fill_random(std::span<std::byte> out, std::mt19937_64& rng) {
    std::size_t i = 0;
    for (; i + 8 <= out.size(); i += 8) {
        const std::uint64_t v = rng();
        std::memcpy(out.data() + i, &v, 8);
    }
    for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(rng());
}

inline std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
    std::vector<std::byte> v(n);
    fill_random(v, rng);
    return v;
}

// A child process running this test binary with ZINF_SWAP_CHILD=<mode> and
// ZINF_SWAP_CHILD_DIR=<dir>, filtered to the SwapChild.Main test. It writes "ready <pid>\n" to
// its stdout (a pipe) once it holds what the mode says, then waits to be killed.
struct Child {
    int pid = -1;
    int read_fd = -1;
};
Child spawn_child(const std::string& mode, const std::string& dir);
// Reads the child's "ready" line (up to 30 s); false if it exited or timed out.
bool wait_child_ready(const Child& child);
// SIGKILLs the child and reaps it.
void kill_child(Child& child);

}  // namespace zinf::swap::test
