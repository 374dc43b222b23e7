// TensorSwapper: runs of partitions through pinned pool buffers.
#include "swap/tensor_swapper.h"

#include <cstring>

#include "src/base/log.h"

namespace zinf::swap {

PartitionId SwapTicket::partition(std::size_t i) const noexcept {
    ZINF_ASSERT_LT(i, count_);
    return ids_[i];
}

std::span<std::byte> SwapTicket::data(std::size_t i) noexcept {
    ZINF_ASSERT_LT(i, count_);
    ZINF_ASSERT(buffer_.valid());
    return buffer_.span().subspan(offsets_bytes_[i], sizes_bytes_[i]);
}

void SwapTicket::release() noexcept {
    ZINF_ASSERT_MSG(!handle_.in_use(), "SwapTicket::release() while an operation is in flight");
    buffer_.reset();
    count_ = 0;
}

TensorSwapper::TensorSwapper(SwapStore& store, PinnedPool& pool,
                             const TensorSwapperOptions& options)
    : store_(store), pool_(pool), options_(options) {}

template <typename GetId>
Result<std::size_t> TensorSwapper::plan_run(std::size_t count, GetId get_id) const {
    ZINF_ASSERT_GT(count, 0u);
    const PartitionId first = get_id(0);
    if (!store_.contains(first)) {
        return Status::not_found(str_cat("swap '", store_.name(), "': unknown partition ", first));
    }
    const Extent a = store_.extent(first);
    if (a.size_bytes > pool_.buffer_size_bytes()) {
        return Status::invalid_argument(
            str_cat("swap '", store_.name(), "': partition ", first, " of ", a.size_bytes,
                    " bytes does not fit a buffer of pool '", pool_.name(), "' (",
                    pool_.buffer_size_bytes(), " bytes); read it in ranges"));
    }
    std::size_t n = 1;
    const std::size_t limit = std::min(count, kMaxRunPartitions);
    while (n < limit) {
        const PartitionId id = get_id(n);
        if (!store_.contains(id)) break;
        const Extent e = store_.extent(id);
        if (e.layout_index != a.layout_index + n) break;
        if (e.offset_bytes + e.size_bytes - a.offset_bytes > pool_.buffer_size_bytes()) break;
        ++n;
    }
    return n;
}

Status TensorSwapper::ensure_buffer(SwapTicket& ticket) {
    ZINF_ASSERT(!ticket.in_flight());
    if (ticket.buffer_.valid()) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(ticket.buffer_, pool_.acquire(options_.acquire_timeout));
    return Status::ok();
}

Result<std::size_t> TensorSwapper::prepare(std::span<const PartitionId> partitions,
                                           SwapTicket& ticket) {
    ZINF_ASSERT(!partitions.empty());
    ZINF_ASSIGN_OR_RETURN(const std::size_t n, plan_run(partitions.size(), [&](std::size_t i) {
                              return partitions[i];
                          }));
    ZINF_TRY(ensure_buffer(ticket));
    const Extent a = store_.extent(partitions[0]);
    for (std::size_t i = 0; i < n; ++i) {
        const Extent e = store_.extent(partitions[i]);
        ticket.ids_[i] = partitions[i];
        ticket.offsets_bytes_[i] = e.offset_bytes - a.offset_bytes;
        ticket.sizes_bytes_[i] = e.size_bytes;
    }
    ticket.count_ = static_cast<std::uint32_t>(n);
    ticket.range_ = false;
    return n;
}

Result<std::size_t> TensorSwapper::swap_in(std::span<const PartitionId> partitions,
                                           SwapTicket& ticket) {
    ZINF_ASSIGN_OR_RETURN(const std::size_t n, prepare(partitions, ticket));
    ZINF_TRY(store_.swap_in_run(partitions.first(n), ticket.buffer_.span(), ticket.handle_));
    return n;
}

Result<std::size_t> TensorSwapper::swap_out(std::span<const SwapOutItem> items,
                                            SwapTicket& ticket) {
    ZINF_ASSERT(!items.empty());
    ZINF_ASSIGN_OR_RETURN(const std::size_t n, plan_run(items.size(), [&](std::size_t i) {
                              return items[i].partition;
                          }));
    ZINF_TRY(ensure_buffer(ticket));
    const Extent a = store_.extent(items[0].partition);
    for (std::size_t i = 0; i < n; ++i) {
        const Extent e = store_.extent(items[i].partition);
        if (items[i].data.size() != e.size_bytes) {
            return Status::invalid_argument(
                str_cat("swap '", store_.name(), "': swap-out of partition ", items[i].partition,
                        " with ", items[i].data.size(), " bytes; it has ", e.size_bytes));
        }
        ticket.ids_[i] = items[i].partition;
        ticket.offsets_bytes_[i] = e.offset_bytes - a.offset_bytes;
        ticket.sizes_bytes_[i] = e.size_bytes;
        std::memcpy(ticket.buffer_.data() + ticket.offsets_bytes_[i], items[i].data.data(),
                    e.size_bytes);
    }
    ticket.count_ = static_cast<std::uint32_t>(n);
    ticket.range_ = false;
    ZINF_TRY(write_back(ticket));
    return n;
}

Status TensorSwapper::write_back(SwapTicket& ticket, WriteTarget target) {
    ZINF_ASSERT(ticket.buffer_.valid());
    ZINF_ASSERT(!ticket.in_flight());
    ZINF_ASSERT(!ticket.range_);
    ZINF_ASSERT_GT(ticket.count_, 0u);
    return store_.swap_out_run(std::span<const PartitionId>(ticket.ids_.data(), ticket.count_),
                               ticket.buffer_.span(), ticket.handle_, target);
}

Status TensorSwapper::swap_in_range(PartitionId partition, std::uint64_t offset_bytes,
                                    std::uint64_t length_bytes, SwapTicket& ticket) {
    if (!store_.contains(partition)) {
        return Status::not_found(
            str_cat("swap '", store_.name(), "': unknown partition ", partition));
    }
    const Extent e = store_.extent(partition);
    if (length_bytes == 0 || offset_bytes > e.size_bytes ||
        length_bytes > e.size_bytes - offset_bytes) {
        return Status::invalid_argument(str_cat("swap '", store_.name(), "': range [", offset_bytes,
                                                ", +", length_bytes, ") outside partition ",
                                                partition, " of ", e.size_bytes, " bytes"));
    }
    const RangeRead r = store_.range_read(partition, offset_bytes, length_bytes);
    if (r.read_length_bytes > pool_.buffer_size_bytes()) {
        return Status::invalid_argument(
            str_cat("swap '", store_.name(), "': range of ", length_bytes, " bytes (",
                    r.read_length_bytes, " with whole swap blocks) exceeds a buffer of pool '",
                    pool_.name(), "' (", pool_.buffer_size_bytes(), " bytes)"));
    }
    ZINF_TRY(ensure_buffer(ticket));
    ticket.ids_[0] = partition;
    ticket.offsets_bytes_[0] = r.skip_bytes;
    ticket.sizes_bytes_[0] = length_bytes;
    ticket.count_ = 1;
    ticket.range_ = true;
    return store_.swap_in_range(partition, offset_bytes, length_bytes, ticket.buffer_.span(),
                                ticket.handle_);
}

}  // namespace zinf::swap
