// Small statistics the benchmarks share: the median of several alternated runs.
#pragma once

#include <algorithm>
#include <vector>

namespace zinf::bench {

// The median (the mean of the middle two for an even count). Precondition: v is not empty.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace zinf::bench
