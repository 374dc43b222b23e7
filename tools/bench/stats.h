// Small statistics the benchmarks share: the median of several alternated runs, and the time
// since a start.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace zinf::bench {

// Seconds on the steady clock since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The median (the mean of the middle two for an even count). Precondition: v is not empty.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace zinf::bench
