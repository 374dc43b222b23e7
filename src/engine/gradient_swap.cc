// GradientSwap: write-behind of reduced gradient slices, read-ahead of sub-groups.
#include "src/engine/gradient_swap.h"

#include <algorithm>
#include <cstring>

#include "kernels/cast.h"
#include "src/base/log.h"

namespace zinf::engine {
namespace {

constexpr std::size_t kWriteSlots = 4;

}  // namespace

Status reserve_gradient_partitions(swap::SwapStore& store, const zero::Partitioning& part,
                                   DType dtype) {
    const std::size_t eb = dtype_size_bytes(dtype);
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        ZINF_TRY(store.reserve(kGradientPartitionBase + static_cast<swap::PartitionId>(i),
                               part.slot(i).slice_numel * eb));
    }
    return Status::ok();
}

GradientSwap::GradientSwap(swap::SwapStore& store, const zero::Partitioning& part, DType dtype,
                           std::size_t sub_group_numel, Device& device,
                           const kernels::OptimizerKernel& kernel)
    : store_(store),
      part_(part),
      dtype_(dtype),
      eb_(dtype_size_bytes(dtype)),
      sub_group_numel_(sub_group_numel),
      device_(device),
      kernel_(kernel) {}

GradientSwap::~GradientSwap() {
    drop_reads();
    drop_ahead();
    for (WriteSlot& w : writes_) {
        if (w.handle.in_use()) {
            const Status ignored = w.handle.wait();
            (void)ignored;
        }
    }
}

std::size_t GradientSwap::slice_bytes(std::size_t i) const noexcept {
    return part_.slot(i).slice_numel * eb_;
}

Result<std::unique_ptr<GradientSwap>> GradientSwap::create(swap::SwapStore& store,
                                                           const zero::Partitioning& part,
                                                           DType dtype, std::size_t sub_group_numel,
                                                           Device& device,
                                                           const kernels::OptimizerKernel& kernel) {
    ZINF_ASSERT_GT(sub_group_numel, 0u);
    const std::size_t params = part.parameter_count();
    auto g = std::unique_ptr<GradientSwap>(
        new GradientSwap(store, part, dtype, sub_group_numel, device, kernel));
    // The domain is the slices laid end to end, in parameter order.
    std::size_t at = 0, largest = 0;
    for (std::size_t i = 0; i < params; ++i) {
        ZINF_ASSERT_EQ(part.slot(i).partition_offset_numel, at);
        ZINF_ASSERT(store.contains(g->partition(i)));
        at += part.slot(i).slice_numel;
        largest = std::max(largest, g->slice_bytes(i));
    }
    ZINF_ASSERT_EQ(at, part.partition_numel());
    g->on_disk_.assign(params, OnDisk::kNothing);
    g->stored_.assign(params, false);
    g->partial_taken_.assign(params, false);
    g->partials_.assign(params, 0.0);
    g->nonfinite_.assign(params, 0);
    g->order_.reserve(params);
    // The buffers that NVMe I/O moves are in huge pages where the kernel has them (see
    // advise_huge_pages).
    ZINF_ASSIGN_OR_RETURN(g->ahead_,
                          AlignedBuffer::allocate_for_io(std::max<std::size_t>(largest, 64)));
    g->host_bytes_ += g->ahead_.size();
    g->writes_ = std::vector<WriteSlot>(kWriteSlots);
    for (WriteSlot& w : g->writes_) {
        ZINF_ASSIGN_OR_RETURN(w.buffer,
                              AlignedBuffer::allocate_for_io(std::max<std::size_t>(largest, 64)));
        g->host_bytes_ += w.buffer.size();
    }
    // The read buffers: the largest run of covered partitions (staging, with the alignment
    // between partitions) and the largest covered span (contiguous) over the sub-groups.
    std::size_t staging = 64, contiguous = 64, runs = 1;
    const std::size_t domain = part.partition_numel();
    for (std::uint64_t off = 0; off < domain; off += sub_group_numel) {
        const std::uint64_t n = std::min<std::uint64_t>(sub_group_numel, domain - off);
        std::size_t first = 0, last = 0;
        g->covering(off, n, first, last);
        staging = std::max<std::size_t>(staging,
                                        store.run_bytes(g->partition(first), g->partition(last)));
        const std::size_t end =
            part.slot(last).partition_offset_numel + part.slot(last).slice_numel;
        contiguous = std::max(contiguous, (end - part.slot(first).partition_offset_numel) * g->eb_);
        runs = std::max(runs, last - first + 1);
    }
    for (ReadSlot& r : g->reads_) {
        ZINF_ASSIGN_OR_RETURN(r.staging, AlignedBuffer::allocate_for_io(staging));
        ZINF_ASSIGN_OR_RETURN(r.contiguous, AlignedBuffer::allocate_for_io(contiguous));
        r.handles = std::make_unique<swap::SwapHandle[]>(runs);
        g->host_bytes_ += r.staging.size() + r.contiguous.size();
    }
    g->run_.reserve(std::min(runs, swap::kMaxRunPartitions));
    return g;
}

void GradientSwap::covering(std::uint64_t offset, std::uint64_t numel, std::size_t& first,
                            std::size_t& last) const noexcept {
    const std::size_t params = part_.parameter_count();
    first = 0;
    while (first + 1 < params &&
           part_.slot(first).partition_offset_numel + part_.slot(first).slice_numel <= offset) {
        ++first;
    }
    last = first;
    while (last + 1 < params && part_.slot(last + 1).partition_offset_numel < offset + numel) {
        ++last;
    }
}

void GradientSwap::take_partial(std::size_t i, const std::byte* values) {
    const std::size_t n = part_.slot(i).slice_numel;
    double sum = 0.0;
    std::size_t nonfinite = 0;
    for (std::size_t at = 0; at < n; at += kNormChunkNumel) {
        const std::size_t len = std::min(kNormChunkNumel, n - at);
        const auto s = kernel_.grad_stats(kernels::GradView{values + at * eb_, len, dtype_});
        if (s.has_inf_nan) ++nonfinite;
        sum += s.sum_squares;
    }
    partials_[i] = sum;
    nonfinite_[i] = nonfinite;
    partial_taken_[i] = true;
}

Status GradientSwap::io_only_pass(std::uint64_t micro_steps) {
    drop_reads();
    drop_ahead();
    for (std::uint64_t m = 0; m < micro_steps; ++m) {
        for (std::size_t i = 0; i < on_disk_.size(); ++i) {
            if (on_disk_[i] != OnDisk::kStored) continue;
            WriteSlot& w = writes_[next_write_];
            next_write_ = (next_write_ + 1) % writes_.size();
            if (w.handle.in_use()) {
                Status s = w.handle.wait();
                if (!s.is_ok()) return s.with_context(str_cat("gradient of parameter ", w.param));
            }
            ZINF_TRY(wait_write_of(i));
            const std::size_t bytes = slice_bytes(i);
            w.param = i;
            swap::SwapHandle read;
            ZINF_TRY(store_.swap_in(partition(i), w.buffer.span().first(bytes), read));
            if (Status r = read.wait(); !r.is_ok()) {
                return r.with_context(str_cat("gradient of parameter ", i));
            }
            io_only_bytes_read_ += bytes;
            ZINF_TRY(store_.swap_out(partition(i), w.buffer.span().first(bytes), w.handle));
            io_only_bytes_written_ += bytes;
        }
    }
    return wait_writes();
}

Status GradientSwap::wait_write_of(std::size_t i) {
    for (WriteSlot& w : writes_) {
        if (w.param != i || !w.handle.in_use()) continue;
        Status s = w.handle.wait();
        if (!s.is_ok()) return s.with_context(str_cat("gradient of parameter ", i));
    }
    return Status::ok();
}

Status GradientSwap::wait_writes() {
    Status first = Status::ok();
    for (WriteSlot& w : writes_) {
        if (!w.handle.in_use()) continue;
        Status s = w.handle.wait();
        if (!s.is_ok() && first.is_ok()) {
            first = s.with_context(str_cat("gradient of parameter ", w.param));
        }
    }
    return first;
}

void GradientSwap::drop_reads() noexcept {
    for (ReadSlot& r : reads_) {
        for (std::size_t h = 0; h < r.handles_used; ++h) {
            if (r.handles[h].in_use()) {
                const Status ignored = r.handles[h].wait();
                (void)ignored;
            }
        }
        r.handles_used = 0;
        r.holds = false;
    }
}

// out[j] = round(a[j] + b[j]) in the dtype, fp32 in between: the coordinator's cast, add, cast,
// element for element (the casts are exact one way and round to nearest even the other in every
// variant). Chunks of fp32 on the stack; the ISA's casts.
void GradientSwap::add_rounded(std::byte* out, const std::byte* a, const std::byte* b,
                               std::size_t numel) const {
    const bool fp32 = dtype_ == DType::kFloat32;
    const DType kd = dtype_;
    const kernels::Isa isa = kernel_.isa();
    for (std::size_t j = 0; j < numel; j += kAddChunk) {
        const std::size_t n = std::min(kAddChunk, numel - j);
        alignas(64) float x[kAddChunk];
        alignas(64) float y[kAddChunk];
        alignas(64) std::uint16_t h[kAddChunk];
        if (fp32) {
            std::memcpy(x, a + j * 4, n * 4);
            std::memcpy(y, b + j * 4, n * 4);
        } else {
            std::memcpy(h, a + j * 2, n * 2);
            kernels::cast_to_fp32(isa, std::span<const std::uint16_t>(h, n), kd,
                                  std::span<float>(x, n));
            std::memcpy(h, b + j * 2, n * 2);
            kernels::cast_to_fp32(isa, std::span<const std::uint16_t>(h, n), kd,
                                  std::span<float>(y, n));
        }
        for (std::size_t k = 0; k < n; ++k) x[k] += y[k];
        if (fp32) {
            std::memcpy(out + j * 4, x, n * 4);
        } else {
            kernels::cast_from_fp32(isa, std::span<const float>(x, n),
                                    std::span<std::uint16_t>(h, n), kd);
            std::memcpy(out + j * 2, h, n * 2);
        }
    }
}

Status GradientSwap::start_ahead(std::size_t i) {
    ZINF_ASSERT_EQ(ahead_param_, kNoParam);
    ZINF_TRY(wait_write_of(i));
    ZINF_TRY(store_.swap_in(partition(i), ahead_.span().first(slice_bytes(i)), ahead_handle_));
    ahead_param_ = i;
    return Status::ok();
}

void GradientSwap::drop_ahead() noexcept {
    if (ahead_param_ == kNoParam) return;
    if (ahead_handle_.in_use()) {
        const Status ignored = ahead_handle_.wait();  // a guess: the read is redone if needed
        (void)ignored;
    }
    ahead_param_ = kNoParam;
}

Status GradientSwap::store(std::size_t index, const void* slice, std::size_t numel, bool first,
                           StreamId stream) {
    ZINF_ASSERT_LT(index, on_disk_.size());
    ZINF_ASSERT_EQ(numel, part_.slot(index).slice_numel);
    drop_reads();  // a step that stopped part-way may have left a read in flight
    const std::size_t bytes = slice_bytes(index);
    WriteSlot& w = writes_[next_write_];
    next_write_ = (next_write_ + 1) % writes_.size();
    if (w.handle.in_use()) {
        Status s = w.handle.wait();
        if (!s.is_ok()) return s.with_context(str_cat("gradient of parameter ", w.param));
    }
    w.param = index;
    if (first || on_disk_[index] != OnDisk::kStored) {
        ZINF_TRY(device_.copy_to_host(w.buffer.data(), slice, bytes, stream));
        ZINF_TRY(device_.synchronize(stream));
    } else {
        // Accumulation: the stored sum, plus this slice, rounded to the dtype as the
        // coordinator's cast, add, cast does in memory.
        const std::byte* sum = w.buffer.data();
        if (ahead_param_ == index) {
            ahead_param_ = kNoParam;
            Status r = ahead_handle_.wait();
            if (!r.is_ok()) return r.with_context(str_cat("gradient of parameter ", index));
            sum = ahead_.data();
            ++read_ahead_hits_;
        } else {
            drop_ahead();
            // The partition's last write must be complete (its wait marks it valid).
            ZINF_TRY(wait_writes());
            swap::SwapHandle read;
            ZINF_TRY(store_.swap_in(partition(index), w.buffer.span().first(bytes), read));
            Status r = read.wait();
            if (!r.is_ok()) return r.with_context(str_cat("gradient of parameter ", index));
        }
        bytes_read_ += bytes;
        ++accumulations_;
        ZINF_TRY(device_.synchronize(stream));
        add_rounded(w.buffer.data(), sum, static_cast<const std::byte*>(slice), numel);
    }
    if (final_) take_partial(index, w.buffer.data());
    ZINF_TRY(store_.swap_out(partition(index), w.buffer.span().first(bytes), w.handle));
    bytes_written_ += bytes;
    on_disk_[index] = OnDisk::kStored;
    stored_[index] = true;
    if (first) {
        if (order_.size() < order_.capacity()) order_.push_back(index);
    } else if (!order_.empty()) {
        // The next accumulating store, by the first micro-step's order; none after the last
        // slice of the window's last micro-step.
        const std::size_t next = (position_ + 1) % order_.size();
        ++position_;
        if (!(next == 0 && final_) && ahead_param_ == kNoParam &&
            on_disk_[order_[next]] == OnDisk::kStored) {
            ZINF_TRY(start_ahead(order_[next]));
        }
    }
    return Status::ok();
}

Status GradientSwap::end_window(StreamId stream) {
    drop_ahead();
    order_.clear();
    position_ = 0;
    ZINF_TRY(device_.synchronize(stream));
    ZINF_TRY(wait_writes());
    for (std::size_t i = 0; i < on_disk_.size(); ++i) {
        if (!stored_[i]) {
            on_disk_[i] = OnDisk::kNothing;  // no gradient in the window: zeros, no I/O
            partials_[i] = 0.0;
            nonfinite_[i] = 0;
        } else if (!partial_taken_[i]) {
            // Stored in an earlier micro-step only: the final sum is on disk.
            AlignedBuffer& b = writes_[0].buffer;
            swap::SwapHandle read;
            ZINF_TRY(store_.swap_in(partition(i), b.span().first(slice_bytes(i)), read));
            Status r = read.wait();
            if (!r.is_ok()) return r.with_context(str_cat("gradient of parameter ", i));
            bytes_read_ += slice_bytes(i);
            take_partial(i, b.data());
        }
        stored_[i] = false;
        partial_taken_[i] = false;
    }
    return Status::ok();
}

Status GradientSwap::start_read(ReadSlot& slot, std::uint64_t offset, std::uint64_t numel) {
    slot.holds = true;
    slot.offset_numel = offset;
    slot.numel = numel;
    slot.handles_used = 0;
    covering(offset, numel, slot.first_param, slot.last_param);
    const std::uint64_t base = store_.extent(partition(slot.first_param)).offset_bytes;
    std::vector<swap::PartitionId>& run = run_;  // reserved at create: the step allocates nothing
    run.clear();
    auto flush = [&]() -> Status {
        if (run.empty()) return Status::ok();
        const std::uint64_t at = store_.extent(run.front()).offset_bytes - base;
        const std::uint64_t len = store_.run_bytes(run.front(), run.back());
        swap::SwapHandle& h = slot.handles[slot.handles_used];
        ZINF_TRY(store_.swap_in_run(run, slot.staging.span().subspan(at, len), h));
        ++slot.handles_used;
        for (const swap::PartitionId p : run) bytes_read_ += store_.extent(p).size_bytes;
        run.clear();
        return Status::ok();
    };
    for (std::size_t i = slot.first_param; i <= slot.last_param; ++i) {
        if (on_disk_[i] != OnDisk::kStored || run.size() == swap::kMaxRunPartitions) {
            ZINF_TRY(flush());
        }
        if (on_disk_[i] == OnDisk::kStored) run.push_back(partition(i));
    }
    return flush();
}

Status GradientSwap::finish_read(ReadSlot& slot) {
    Status first = Status::ok();
    for (std::size_t h = 0; h < slot.handles_used; ++h) {
        Status s = slot.handles[h].wait();
        if (!s.is_ok() && first.is_ok()) first = s;
    }
    slot.handles_used = 0;
    if (!first.is_ok()) {
        slot.holds = false;
        return first.with_context("reading gradients for the optimizer step");
    }
    const std::uint64_t base = store_.extent(partition(slot.first_param)).offset_bytes;
    const std::size_t origin = part_.slot(slot.first_param).partition_offset_numel;
    for (std::size_t i = slot.first_param; i <= slot.last_param; ++i) {
        std::byte* to =
            slot.contiguous.data() + (part_.slot(i).partition_offset_numel - origin) * eb_;
        if (on_disk_[i] == OnDisk::kStored) {
            const std::uint64_t at = store_.extent(partition(i)).offset_bytes - base;
            std::memcpy(to, slot.staging.data() + at, slice_bytes(i));
        } else {
            std::memset(to, 0, slice_bytes(i));
        }
    }
    return Status::ok();
}

Result<std::span<const std::byte>> GradientSwap::gradients(std::uint64_t offset_numel,
                                                           std::uint64_t numel) {
    const std::size_t domain = part_.partition_numel();
    ZINF_ASSERT_LE(offset_numel + numel, domain);
    ReadSlot* slot = nullptr;
    for (ReadSlot& r : reads_) {
        if (r.holds && r.offset_numel == offset_numel && r.numel == numel) slot = &r;
    }
    if (slot == nullptr) {
        drop_reads();
        slot = &reads_[next_read_];
        next_read_ = (next_read_ + 1) % 2;
        ZINF_TRY(start_read(*slot, offset_numel, numel));
    }
    ZINF_TRY(finish_read(*slot));
    // The next sub-group comes in while the optimizer works on this one.
    const std::uint64_t next = offset_numel + numel;
    if (next < domain) {
        ReadSlot& other = slot == &reads_[0] ? reads_[1] : reads_[0];
        if (!other.holds || other.offset_numel != next) {
            for (std::size_t h = 0; h < other.handles_used; ++h) {
                const Status ignored = other.handles[h].wait();
                (void)ignored;
            }
            other.handles_used = 0;
            ZINF_TRY(
                start_read(other, next, std::min<std::uint64_t>(sub_group_numel_, domain - next)));
        }
        next_read_ = slot == &reads_[0] ? 0 : 1;
    }
    slot->holds = false;  // taken: the next call will not find it
    const std::size_t origin = part_.slot(slot->first_param).partition_offset_numel;
    return std::span<const std::byte>(slot->contiguous.data() + (offset_numel - origin) * eb_,
                                      numel * eb_);
}

}  // namespace zinf::engine
