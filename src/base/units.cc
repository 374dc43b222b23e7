// Size and count parsing shared by the config loader and the command-line tools.
#include "src/base/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/base/log.h"

namespace zinf {
namespace {

struct Suffix {
    const char* text;
    double multiplier;
};

Result<std::uint64_t> parse_with(std::string_view text, const Suffix* suffixes, std::size_t count,
                                 const char* what) {
    std::string s(text);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    std::size_t start = 0;
    while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
    s = s.substr(start);
    if (s.empty()) return Status::invalid_argument(str_cat("empty ", what));
    std::size_t end = 0;
    while (end < s.size() &&
           (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.' ||
            ((s[end] == 'e' || s[end] == 'E') && end + 1 < s.size() &&
             (std::isdigit(static_cast<unsigned char>(s[end + 1])) || s[end + 1] == '+')) ||
            (s[end] == '+' && end > 0 && (s[end - 1] == 'e' || s[end - 1] == 'E')))) {
        ++end;
    }
    if (end == 0) {
        return Status::invalid_argument(str_cat("'", text, "' is not a ", what,
                                                " (expected a non-negative number, e.g. 4GiB)"));
    }
    char* parse_end = nullptr;
    const std::string number = s.substr(0, end);
    const double value = std::strtod(number.c_str(), &parse_end);
    if (parse_end != number.c_str() + number.size() || !std::isfinite(value) || value < 0) {
        return Status::invalid_argument(str_cat("'", text, "' is not a valid ", what));
    }
    std::string suffix = s.substr(end);
    while (!suffix.empty() && suffix.front() == ' ') suffix.erase(suffix.begin());
    double multiplier = 1;
    if (!suffix.empty()) {
        bool found = false;
        for (std::size_t i = 0; i < count; ++i) {
            if (suffix == suffixes[i].text) {
                multiplier = suffixes[i].multiplier;
                found = true;
                break;
            }
        }
        if (!found) {
            return Status::invalid_argument(
                str_cat("'", text, "': unknown unit '", suffix, "' in ", what));
        }
    }
    const double total = value * multiplier;
    if (total > 1.8e19)
        return Status::invalid_argument(str_cat("'", text, "': ", what, " too large"));
    const double rounded = std::floor(total);
    if (rounded != total) {
        return Status::invalid_argument(str_cat("'", text, "' is not a whole number (", what, ")"));
    }
    return static_cast<std::uint64_t>(rounded);
}

constexpr double kKi = 1024.0;
const Suffix kSizeSuffixes[] = {
    {"B", 1},
    {"K", kKi},
    {"KiB", kKi},
    {"KB", 1e3},
    {"k", kKi},
    {"M", kKi* kKi},
    {"MiB", kKi* kKi},
    {"MB", 1e6},
    {"G", kKi* kKi* kKi},
    {"GiB", kKi* kKi* kKi},
    {"GB", 1e9},
    {"T", kKi* kKi* kKi* kKi},
    {"TiB", kKi* kKi* kKi* kKi},
    {"TB", 1e12},
};
const Suffix kCountSuffixes[] = {
    {"K", 1e3},
    {"k", 1e3},
    {"M", 1e6},
    {"G", 1e9},
    {"B", 1e9},
    {"T", 1e12},
    {"Ki", kKi},
    {"Mi", kKi* kKi},
    {"Gi", kKi* kKi* kKi},
    {"Ti", kKi* kKi* kKi* kKi},
};

}  // namespace

Result<std::uint64_t> parse_size_bytes(std::string_view text) {
    return parse_with(text, kSizeSuffixes, std::size(kSizeSuffixes), "size");
}

Result<std::uint64_t> parse_count(std::string_view text) {
    return parse_with(text, kCountSuffixes, std::size(kCountSuffixes), "count");
}

std::string format_bytes(std::uint64_t bytes) {
    static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = static_cast<double>(bytes);
    int unit = 0;
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        ++unit;
    }
    char out[64];
    if (unit == 0) {
        std::snprintf(out, sizeof(out), "%llu B", static_cast<unsigned long long>(bytes));
    } else {
        std::snprintf(out, sizeof(out), "%.2f %s", value, kUnits[unit]);
    }
    return out;
}

}  // namespace zinf
