// parse_fault_plan: the text form of io::FaultPlan (the bench's --fault flag, tests).
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "io/fault.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::io {
namespace {

Result<double> parse_probability(std::string_view key, std::string_view value) {
    std::string text(value);
    char* end = nullptr;
    const double p = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !(p >= 0.0 && p <= 1.0)) {
        return Status::invalid_argument(
            str_cat("fault plan: ", key, ": expected a probability in [0, 1], got '", value, "'"));
    }
    return p;
}

Result<std::uint64_t> parse_uint(std::string_view key, std::string_view value) {
    std::uint64_t v = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || ec != std::errc() || ptr != value.data() + value.size()) {
        return Status::invalid_argument(
            str_cat("fault plan: ", key, ": expected a non-negative integer, got '", value, "'"));
    }
    return v;
}

Result<int> parse_errno(std::string_view value) {
    struct Named {
        std::string_view name;
        int value;
    };
    static constexpr Named kNames[] = {{"EIO", EIO},       {"ENOSPC", ENOSPC}, {"EAGAIN", EAGAIN},
                                       {"EINTR", EINTR},   {"EINVAL", EINVAL}, {"EBADF", EBADF},
                                       {"EROFS", EROFS},   {"EDQUOT", EDQUOT}, {"ENODEV", ENODEV},
                                       {"EFAULT", EFAULT}, {"ENOMEM", ENOMEM}, {"EPERM", EPERM}};
    for (const auto& n : kNames) {
        if (n.name == value) return n.value;
    }
    std::uint64_t v = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (!value.empty() && ec == std::errc() && ptr == value.data() + value.size() && v > 0 &&
        v < 4096) {
        return static_cast<int>(v);
    }
    return Status::invalid_argument(str_cat(
        "fault plan: errno: expected a name such as EIO or ENOSPC, or a positive number, got '",
        value, "'"));
}

}  // namespace

Result<FaultPlan> parse_fault_plan(const std::string& text) {
    FaultPlan plan;
    std::string_view rest(text);
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        if (item.empty()) continue;
        const std::size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            return Status::invalid_argument(
                str_cat("fault plan: expected key=value, got '", item, "'"));
        }
        const std::string_view key = item.substr(0, eq);
        const std::string_view value = item.substr(eq + 1);
        if (key == "fail_nth") {
            ZINF_ASSIGN_OR_RETURN(plan.fail_nth_op, parse_uint(key, value));
        } else if (key == "errno") {
            ZINF_ASSIGN_OR_RETURN(plan.errno_to_inject, parse_errno(value));
        } else if (key == "short") {
            ZINF_ASSIGN_OR_RETURN(plan.short_transfer_probability, parse_probability(key, value));
        } else if (key == "read_error") {
            ZINF_ASSIGN_OR_RETURN(plan.read_error_probability, parse_probability(key, value));
        } else if (key == "write_error") {
            ZINF_ASSIGN_OR_RETURN(plan.write_error_probability, parse_probability(key, value));
        } else if (key == "corrupt") {
            ZINF_ASSIGN_OR_RETURN(plan.corrupt_probability, parse_probability(key, value));
        } else if (key == "seed") {
            ZINF_ASSIGN_OR_RETURN(plan.seed, parse_uint(key, value));
        } else if (key == "enospc_after") {
            auto bytes = parse_size_bytes(value);
            if (!bytes.has_value()) return bytes.error().with_context("fault plan: enospc_after");
            plan.enospc_after_bytes = *bytes;
        } else if (key == "latency_us") {
            const std::size_t dash = value.find('-');
            const std::string_view lo = value.substr(0, dash);
            const std::string_view hi =
                dash == std::string_view::npos ? lo : value.substr(dash + 1);
            ZINF_ASSIGN_OR_RETURN(const std::uint64_t min_us, parse_uint(key, lo));
            ZINF_ASSIGN_OR_RETURN(const std::uint64_t max_us, parse_uint(key, hi));
            if (min_us > max_us || max_us > 10'000'000) {
                return Status::invalid_argument(str_cat(
                    "fault plan: latency_us: expected MIN-MAX with MIN <= MAX <= 10000000, got '",
                    value, "'"));
            }
            plan.latency_us_min = static_cast<std::uint32_t>(min_us);
            plan.latency_us_max = static_cast<std::uint32_t>(max_us);
        } else {
            return Status::invalid_argument(str_cat(
                "fault plan: unknown key '", key,
                "' (expected fail_nth, errno, short, read_error, write_error, corrupt, latency_us, "
                "enospc_after, seed)"));
        }
    }
    return plan;
}

}  // namespace zinf::io
