// io::FaultPlan: what io::FaultyBackend injects (a feature, used by tests and by the bench).
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>

#include "src/base/status.h"

namespace zinf::io {

struct FaultPlan {
    std::uint64_t seed = 1;
    double read_error_probability = 0;
    double write_error_probability = 0;
    double short_transfer_probability = 0;  // a piece completes with fewer bytes than asked
    double corrupt_probability = 0;         // a completed read has one byte flipped
    int errno_to_inject = EIO;
    // Fail the n-th piece (1-based) submitted through this plan; 0: never.
    std::uint64_t fail_nth_op = 0;
    // Writes fail with ENOSPC once this many bytes have been written; 0: never.
    std::uint64_t enospc_after_bytes = 0;
    std::uint32_t latency_us_min = 0;
    std::uint32_t latency_us_max = 0;
};

// Parses "fail_nth=5,errno=EIO,short=0.1,latency_us=100-200,enospc_after=1GiB,read_error=0.01,
// write_error=0.01,corrupt=0.001,seed=7" (the bench's --fault flag).
Result<FaultPlan> parse_fault_plan(const std::string& text);

}  // namespace zinf::io
