// Rank-order reductions of host values over a Communicator's all_gather_host.
#include "zero/communicator.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "src/base/log.h"

namespace zinf::zero {
namespace {

template <typename T>
Status sum_in_rank_order(Communicator& comm, std::span<T> values) {
    const auto ws = static_cast<std::size_t>(comm.world_size());
    if (ws == 1 || values.empty()) return Status::ok();
    std::vector<T> all(values.size() * ws);
    ZINF_TRY(
        comm.all_gather_host(std::as_bytes(values), std::as_writable_bytes(std::span<T>(all))));
    for (std::size_t i = 0; i < values.size(); ++i) {
        T sum = all[i];
        for (std::size_t r = 1; r < ws; ++r) sum += all[r * values.size() + i];
        values[i] = sum;
    }
    return Status::ok();
}

}  // namespace

Status sum_over_ranks(Communicator& comm, std::span<double> values) {
    return sum_in_rank_order(comm, values);
}

Status sum_over_ranks(Communicator& comm, std::span<std::uint64_t> values) {
    return sum_in_rank_order(comm, values);
}

Result<bool> any_over_ranks(Communicator& comm, bool flag) {
    std::uint64_t v = flag ? 1 : 0;
    ZINF_TRY(sum_over_ranks(comm, std::span<std::uint64_t>(&v, 1)));
    return v != 0;
}

namespace {
constexpr std::string_view kPeerFailed = ": another rank failed (its error names why)";
}  // namespace

Status peer_failure(std::string_view what) {
    return Status::io_error(str_cat(what, kPeerFailed), EIO);
}

bool is_peer_failure(const Status& s) noexcept {
    return !s.is_ok() && s.message().ends_with(kPeerFailed);
}

Result<std::vector<std::uint64_t>> gather_over_ranks(Communicator& comm, std::uint64_t value) {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.world_size()));
    ZINF_TRY(comm.all_gather_host(std::as_bytes(std::span<const std::uint64_t>(&value, 1)),
                                  std::as_writable_bytes(std::span<std::uint64_t>(all))));
    return all;
}

}  // namespace zinf::zero
