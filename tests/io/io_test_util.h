// Helpers shared by the io tests: engine construction per backend, random bytes, aligned buffers.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/engine.h"
#include "src/base/aligned.h"
#include "tests/support/test_seed.h"

namespace zinf::io::test {

// Waits long enough for any sane test, short enough that a hang becomes a failure.
constexpr std::chrono::microseconds kHangTimeout = std::chrono::seconds(30);

inline io::AioOptions small_aio(const std::string& backend, io::DirectMode direct) {
    io::AioOptions aio;
    aio.backend = backend;
    aio.use_direct = direct;
    aio.block_size_bytes = 64 * 1024;
    aio.queue_depth = 8;
    aio.intra_op_parallelism = 2;
    return aio;
}

// Creates an engine for `backend` ("sim" for the simulated device); null when the backend is
// not available here (the reason goes to *skip).
inline std::unique_ptr<Engine> make_engine(const std::string& backend, io::DirectMode direct,
                                           std::string* skip,
                                           std::optional<FaultPlan> faults = std::nullopt,
                                           io::AioOptions* aio_override = nullptr,
                                           const Seams& seams = {}) {
    EngineOptions options;
    options.aio = aio_override != nullptr ? *aio_override
                                          : small_aio(backend == "sim" ? "auto" : backend, direct);
    if (backend == "sim") {
        SimOptions sim;
        sim.seed = zinf::test::seed();
        sim.latency_us_max = 100;
        options.sim = sim;
    }
    options.faults = faults;
    options.seams = seams;
    auto engine = Engine::create(options);
    if (!engine.has_value()) {
        if (engine.error().code() == StatusCode::kNotSupported) {
            *skip = engine.error().to_string();
            return nullptr;
        }
        ADD_FAILURE() << engine.error().to_string();
        return nullptr;
    }
    return std::move(engine).value();
}

inline void fill_random(std::span<std::byte> bytes, std::mt19937_64& rng) {
    std::size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
        const std::uint64_t v = rng();
        std::memcpy(bytes.data() + i, &v, 8);
    }
    for (; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(rng());
}

inline AlignedBuffer must_allocate(std::size_t size, bool zero = true) {
    auto b = AlignedBuffer::allocate(size, kDefaultAlignmentBytes, zero);
    EXPECT_TRUE(b.has_value());
    return std::move(b).value();
}

}  // namespace zinf::io::test
