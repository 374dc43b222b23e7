// Parsing and printing of sizes ("4GiB", "1MiB", "2G", "1e8") and durations.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace zinf {

// Parses a byte size: a non-negative number with an optional suffix. Binary suffixes
// (KiB, MiB, GiB, TiB, and K, M, G, T, which mean the same) multiply by powers of 1024;
// decimal suffixes (KB, MB, GB, TB) by powers of 1000. "1e8" style numbers are accepted.
// Fractions are allowed when the result is a whole number of bytes.
Result<std::uint64_t> parse_size_bytes(std::string_view text);
// Parses an element count: K, M, G, T are decimal (256M = 256e6), Ki, Mi, Gi, Ti binary
// (64Mi = 64 * 2^20); "1e8" style numbers are accepted.
Result<std::uint64_t> parse_count(std::string_view text);
// "1.50 GiB", "512 KiB", "17 B".
std::string format_bytes(std::uint64_t bytes);

}  // namespace zinf
