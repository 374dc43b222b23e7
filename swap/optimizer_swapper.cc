// OptimizerSwapper: the pipelined read / update / write loop over sub-groups.
#include "swap/optimizer_swapper.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kernels/state_codec.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::swap {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

std::size_t OptimizerSwapper::state_count(kernels::OptimizerKind kind, bool amsgrad) {
    return optimizer_descriptor(kind).state_count(amsgrad);
}

std::uint64_t OptimizerSwapper::state_bytes(std::size_t state, std::uint64_t numel,
                                            StateDType state_dtype) noexcept {
    if (state == 0) return numel * sizeof(float);
    return state_moment_stored_bytes(state_dtype, static_cast<std::size_t>(numel));
}

std::uint64_t OptimizerSwapper::buffer_size_bytes(std::uint64_t sub_group_numel,
                                                  kernels::OptimizerKind kind, bool amsgrad,
                                                  StateDType state_dtype) {
    // Each state is its own partition at an aligned offset (see SwapStore's layout).
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < state_count(kind, amsgrad); ++k) {
        bytes += align_up(state_bytes(k, sub_group_numel, state_dtype), kExtentAlignmentBytes);
    }
    return bytes;
}

std::size_t OptimizerSwapper::buffers_needed(const OptimizerSwapperOptions& options) {
    // One sub-group being updated, plus those being read ahead, plus one being written behind.
    return 1 + (options.pipeline_read ? options.read_ahead : 0) + (options.pipeline_write ? 1 : 0);
}

OptimizerSwapper::OptimizerSwapper(SwapStore& store, const kernels::OptimizerKernel& kernel,
                                   const OptimizerSwapperOptions& options)
    : store_(store), kernel_(kernel), options_(options) {}

Result<std::unique_ptr<OptimizerSwapper>> OptimizerSwapper::create(
    SwapStore& store, PinnedPool& pool, const kernels::OptimizerKernel& kernel,
    const OptimizerSwapperOptions& options) {
    if (options.numel == 0 || options.sub_group_numel == 0) {
        return Status::invalid_argument(str_cat("optimizer swapper: numel (", options.numel,
                                                ") and sub_group_size (", options.sub_group_numel,
                                                ") must be positive"));
    }
    if (options.read_ahead == 0 || options.read_ahead > kMaxReadAhead) {
        return Status::invalid_argument(str_cat("optimizer swapper: read_ahead ",
                                                options.read_ahead, " is not in [1, ",
                                                kMaxReadAhead, "]"));
    }
    if (options.amsgrad && !optimizer_descriptor(options.kind).has_amsgrad) {
        return Status::invalid_argument(str_cat("optimizer swapper: amsgrad with ",
                                                optimizer_kind_name(options.kind),
                                                ", which has none"));
    }
    if (options.state_dtype != StateDType::kFp32) {
        if (options.sub_group_numel % kStateBlockNumel != 0) {
            return Status::invalid_argument(
                str_cat("optimizer swapper: ", state_dtype_name(options.state_dtype),
                        " states need sub_group_size a multiple of ", kStateBlockNumel, ", got ",
                        options.sub_group_numel));
        }
        if (!is_builtin(optimizer_descriptor(options.kind))) {
            return Status::not_supported(
                str_cat("optimizer swapper: ", state_dtype_name(options.state_dtype), " states of ",
                        optimizer_kind_name(options.kind), " (built-in optimizers only)"));
        }
    }
    const std::uint64_t need_bytes = buffer_size_bytes(options.sub_group_numel, options.kind,
                                                       options.amsgrad, options.state_dtype);
    if (pool.buffer_size_bytes() < need_bytes) {
        return Status::invalid_argument(
            str_cat("optimizer swapper: pinned pool '", pool.name(), "' has buffers of ",
                    format_bytes(pool.buffer_size_bytes()), "; a sub-group of ",
                    options.sub_group_numel, " parameters needs ", format_bytes(need_bytes)));
    }
    const std::size_t need_count = buffers_needed(options);
    if (pool.buffer_count() < need_count) {
        return Status::invalid_argument(
            str_cat("optimizer swapper: pinned pool '", pool.name(), "' has ", pool.buffer_count(),
                    " buffers; pipeline_read=", options.pipeline_read,
                    " pipeline_write=", options.pipeline_write, " needs ", need_count));
    }
    std::unique_ptr<OptimizerSwapper> s(new OptimizerSwapper(store, kernel, options));
    s->state_count_ = state_count(options.kind, options.amsgrad);
    s->sub_group_count_ = static_cast<std::size_t>((options.numel + options.sub_group_numel - 1) /
                                                   options.sub_group_numel);
    s->ticket_count_ = need_count;
    for (std::size_t g = 0; g < s->sub_group_count_; ++g) {
        for (std::size_t k = 0; k < s->state_count_; ++k) {
            ZINF_TRY(store.reserve(s->partition(g, k),
                                   state_bytes(k, s->sub_group_numel(g), options.state_dtype)));
        }
    }
    TensorSwapperOptions swapper_options;
    swapper_options.acquire_timeout = options.acquire_timeout;
    s->swapper_ = std::make_unique<TensorSwapper>(store, pool, swapper_options);
    s->tickets_ = std::make_unique<SwapTicket[]>(need_count);
    return s;
}

std::uint64_t OptimizerSwapper::sub_group_numel(std::size_t sub_group) const noexcept {
    ZINF_ASSERT_LT(sub_group, sub_group_count_);
    const std::uint64_t offset = sub_group_offset_numel(sub_group);
    return std::min(options_.sub_group_numel, options_.numel - offset);
}

void OptimizerSwapper::drain() noexcept {
    // After an error: finish whatever is still in flight so that no transfer outlives its
    // buffer, then hand every buffer back.
    for (std::size_t i = 0; i < ticket_count_; ++i) {
        if (tickets_[i].in_flight()) (void)tickets_[i].wait();
        tickets_[i].release();
    }
}

Status OptimizerSwapper::initialize(ParamSource& source) {
    ZINF_ASSERT(store_.committed());
    ZINF_ASSERT(!speculating_);
    Status status;
    PartitionId ids[kMaxStates];
    for (std::size_t g = 0; g < sub_group_count_ && status.is_ok(); ++g) {
        SwapTicket& ticket = tickets_[g % ticket_count_];
        if (ticket.in_flight()) {
            status = ticket.wait();
            if (!status.is_ok()) break;
        }
        for (std::size_t k = 0; k < state_count_; ++k) ids[k] = partition(g, k);
        auto n = swapper_->prepare(std::span<const PartitionId>(ids, state_count_), ticket);
        if (!n.has_value()) {
            status = n.error();
            break;
        }
        ZINF_ASSERT_EQ(*n, state_count_);
        std::span<std::byte> p = ticket.data(0);
        status = source.fill(
            g, sub_group_offset_numel(g),
            std::span<float>(reinterpret_cast<float*>(p.data()), p.size() / sizeof(float)));
        if (!status.is_ok()) break;
        for (std::size_t k = 1; k < state_count_; ++k) {
            std::memset(ticket.data(k).data(), 0, ticket.data(k).size());
        }
        status = swapper_->write_back(ticket);
    }
    for (std::size_t i = 0; i < ticket_count_ && status.is_ok(); ++i) {
        if (tickets_[i].in_flight()) status = tickets_[i].wait();
    }
    drain();
    return status;
}

Status OptimizerSwapper::issue_read(std::size_t sub_group, SwapTicket& ticket) {
    PartitionId ids[kMaxStates];
    for (std::size_t k = 0; k < state_count_; ++k) ids[k] = partition(sub_group, k);
    ZINF_ASSIGN_OR_RETURN(
        const std::size_t n,
        swapper_->swap_in(std::span<const PartitionId>(ids, state_count_), ticket));
    // The pool buffer was checked at create() to hold a whole sub-group, and the states are
    // consecutive in the layout, so one read carries them all.
    ZINF_ASSERT_EQ(n, state_count_);
    stats_.bytes_read += store_.run_bytes(ids[0], ids[state_count_ - 1]);
    return Status::ok();
}

Status OptimizerSwapper::update(std::size_t sub_group, SwapTicket& ticket,
                                const kernels::OptimizerParams& params, GradientSource& grads) {
    const std::uint64_t numel = sub_group_numel(sub_group);
    const std::uint64_t offset = sub_group_offset_numel(sub_group);
    std::span<std::byte> master = ticket.data(0);
    ZINF_ASSERT_EQ(master.size(), numel * sizeof(float));
    // The sub-group's partitions: the master, then the kept moments in the descriptor's order,
    // as stored.
    std::span<std::byte> moments[kMaxMoments];
    for (std::size_t k = 1; k < state_count_; ++k) moments[k - 1] = ticket.data(k);
    const kernels::StoredState state = kernels::stored_state_view(
        options_.state_dtype, std::span<float>(reinterpret_cast<float*>(master.data()), numel),
        std::span<const std::span<std::byte>>(moments, state_count_ - 1), options_.rounding_seed);
    ZINF_ASSIGN_OR_RETURN(const kernels::GradView g, grads.gradients(sub_group, offset, numel));
    if (g.numel != numel || g.data == nullptr) {
        return Status::invalid_argument(str_cat("optimizer swapper: gradients of sub-group ",
                                                sub_group, " have ", g.numel,
                                                " elements; expected ", numel));
    }
    const kernels::ParamCopy copy = grads.param_copy(sub_group, offset, numel);
    const auto t0 = Clock::now();
    ZINF_TRY(kernels::step_segments(kernel_, params, state, offset, options_.segments, g, copy));
    stats_.compute_seconds += seconds_since(t0);
    return grads.updated(sub_group, offset, state.params);
}

Status OptimizerSwapper::check_params(const kernels::OptimizerParams& params) const {
    if (params.kind != options_.kind || params.amsgrad != options_.amsgrad) {
        return Status::invalid_argument(
            str_cat("optimizer swapper: step with ", optimizer_kind_name(params.kind),
                    params.amsgrad ? " (amsgrad)" : "", " on states laid out for ",
                    optimizer_kind_name(options_.kind), options_.amsgrad ? " (amsgrad)" : ""));
    }
    // Reject bad hyperparameters before any sub-group changes.
    return kernels::validate(params);
}

Status OptimizerSwapper::step(const kernels::OptimizerParams& params, GradientSource& grads) {
    ZINF_ASSERT_MSG(!speculating_, "step() while a speculated step awaits commit or discard");
    if (store_.copy_on_write()) {
        ZINF_TRY(speculate(params, grads));
        return commit_speculation();
    }
    ZINF_TRY(check_params(params));
    return run(&params, &grads);
}

Status OptimizerSwapper::pin_states() {
    return store_.pin(options_.first_partition, partition_count());
}

std::uint64_t OptimizerSwapper::pinned_read_bytes(std::size_t sub_group) const {
    return store_.run_bytes(partition(sub_group, 0), partition(sub_group, state_count_ - 1));
}

Status OptimizerSwapper::read_pinned_sub_group(std::size_t sub_group, std::span<float> params,
                                               std::span<const std::span<float>> moments,
                                               AlignedBuffer& scratch) const {
    ZINF_ASSERT_LT(sub_group, sub_group_count_);
    ZINF_ASSERT_LE(moments.size(), state_count_ - 1);
    const std::uint64_t numel = sub_group_numel(sub_group);
    ZINF_ASSERT_EQ(params.size(), numel);
    const std::uint64_t bytes = pinned_read_bytes(sub_group);
    if (scratch.size() < bytes) {
        ZINF_ASSIGN_OR_RETURN(scratch, AlignedBuffer::allocate_for_io(bytes));
    }
    PartitionId ids[kMaxStates];
    for (std::size_t k = 0; k < state_count_; ++k) ids[k] = partition(sub_group, k);
    SwapHandle handle;
    ZINF_TRY(store_.swap_in_pinned_run(std::span<const PartitionId>(ids, state_count_),
                                       scratch.span().first(bytes), handle));
    ZINF_TRY(handle.wait());
    const std::uint64_t base = store_.extent(ids[0]).offset_bytes;
    auto data = [&](std::size_t k) {
        const Extent e = store_.extent(ids[k]);
        return std::span<const std::byte>(scratch.data() + (e.offset_bytes - base), e.size_bytes);
    };
    std::memcpy(params.data(), data(0).data(), numel * sizeof(float));
    const OptimizerDescriptor& d = optimizer_descriptor(options_.kind);
    for (std::size_t k = 0; k < moments.size(); ++k) {
        if (moments[k].empty()) continue;
        ZINF_ASSERT_EQ(moments[k].size(), numel);
        kernels::decode_stored_moment(options_.state_dtype, d.moments[k].non_negative, data(k + 1),
                                      moments[k]);
    }
    return Status::ok();
}

void OptimizerSwapper::unpin_sub_group(std::size_t sub_group) {
    store_.unpin(partition(sub_group, 0), state_count_);
}

Status OptimizerSwapper::speculate(const kernels::OptimizerParams& params, GradientSource& grads) {
    ZINF_ASSERT_MSG(!speculating_, "speculate() twice without commit or discard");
    if (!store_.copy_on_write()) {
        return Status::invalid_argument(
            str_cat("optimizer swapper: speculation needs a "
                    "copy-on-write swap store ('",
                    store_.name(), "' is not)"));
    }
    ZINF_TRY(check_params(params));
    Status s = run(&params, &grads, WriteTarget::kShadow);
    if (!s.is_ok()) {
        store_.discard_shadows(options_.first_partition, partition_count());
        return s;
    }
    speculating_ = true;
    return Status::ok();
}

Status OptimizerSwapper::speculate(const kernels::OptimizerParams& params, GradientSource& grads,
                                   std::span<const std::uint32_t> order, SubGroupGate& gate) {
    ZINF_ASSERT_MSG(!speculating_, "speculate() twice without commit or discard");
    if (!store_.copy_on_write()) {
        return Status::invalid_argument(
            str_cat("optimizer swapper: speculation needs a "
                    "copy-on-write swap store ('",
                    store_.name(), "' is not)"));
    }
    bool permutation = order.size() == sub_group_count_;
    std::vector<bool> seen(sub_group_count_, false);
    for (std::size_t i = 0; i < order.size() && permutation; ++i) {
        permutation = order[i] < sub_group_count_ && !seen[order[i]];
        if (permutation) seen[order[i]] = true;
    }
    if (!permutation) {
        return Status::invalid_argument(str_cat("optimizer swapper: a sub-group order of ",
                                                order.size(), " entries is not a permutation of ",
                                                sub_group_count_, " sub-groups"));
    }
    ZINF_TRY(check_params(params));
    Status s = run(&params, &grads, WriteTarget::kShadow, order, &gate);
    if (!s.is_ok()) {
        store_.discard_shadows(options_.first_partition, partition_count());
        return s;
    }
    speculating_ = true;
    return Status::ok();
}

Status OptimizerSwapper::commit_speculation() {
    ZINF_ASSERT(speculating_);
    auto switched = store_.commit_shadows(options_.first_partition, partition_count());
    if (!switched.has_value()) return switched.status();
    // Shadow writes the engine discarded (the compute-only pass of --measure-overlap) left no
    // shadow: those partitions keep their copies, as a discarded plain write does.
    ZINF_ASSERT(*switched == partition_count() || store_.discarding());
    speculating_ = false;
    return Status::ok();
}

void OptimizerSwapper::discard_speculation() {
    ZINF_ASSERT(speculating_);
    store_.discard_shadows(options_.first_partition, partition_count());
    speculating_ = false;
}

Status OptimizerSwapper::io_only_pass() {
    ZINF_ASSERT_MSG(!speculating_, "io_only_pass() while a speculated step awaits commit");
    return run(nullptr, nullptr);
}

Status OptimizerSwapper::run(const kernels::OptimizerParams* params, GradientSource* grads,
                             WriteTarget target, std::span<const std::uint32_t> order,
                             SubGroupGate* gate) {
    ZINF_ASSERT(store_.committed());
    ZINF_ASSERT(order.empty() || order.size() == sub_group_count_);
    const auto t_step = Clock::now();
    stats_ = OptimizerStepStats{};
    const std::size_t groups = sub_group_count_;
    const std::size_t tickets = ticket_count_;
    const bool pipeline_read = options_.pipeline_read;
    const bool pipeline_write = options_.pipeline_write;
    // The i-th sub-group stepped: in index order, or in the caller's.
    auto group = [&](std::size_t i) -> std::size_t { return order.empty() ? i : order[i]; };

    // Ticket (i % tickets) carries the i-th sub-group. With both pipelines (2 + R tickets, R
    // the read-ahead) at the update of i: i+1 .. i+R are being read, i-1 written; i+R reuses
    // the ticket of i-2, whose write was waited for at the end of iteration i-1 (without
    // pipelined writes, that of i-1, waited for at once).
    const std::size_t ahead = pipeline_read ? options_.read_ahead : 1;
    Status status;
    for (std::size_t j = 0; j < ahead && j < groups && status.is_ok(); ++j) {
        status = issue_read(group(j), tickets_[j]);
    }
    for (std::size_t i = 0; i < groups && status.is_ok(); ++i) {
        const std::size_t g = group(i);
        SwapTicket& current = tickets_[i % tickets];
        auto t0 = Clock::now();
        // Start reading i+1 as soon as i's bytes are in, before verifying i's checksums, so
        // the disk is never idle while this thread hashes.
        current.wait_transfer();
        stats_.read_wait_seconds += seconds_since(t0);
        if (pipeline_read && i + ahead < groups) {
            status = issue_read(group(i + ahead), tickets_[(i + ahead) % tickets]);
            if (!status.is_ok()) {
                (void)current.wait();
                break;
            }
        }
        status = current.wait();
        if (!status.is_ok()) break;
        if (params != nullptr) {
            if (gate != nullptr) {
                status = gate->ready(g);
                if (!status.is_ok()) break;
            }
            status = update(g, current, *params, *grads);
            if (!status.is_ok()) break;
        }
        status = swapper_->write_back(current, target);
        if (!status.is_ok()) break;
        stats_.bytes_written += store_.run_bytes(partition(g, 0), partition(g, state_count_ - 1));
        t0 = Clock::now();
        if (!pipeline_write) {
            status = current.wait();
        } else if (i >= 1) {
            status = tickets_[(i - 1) % tickets].wait();
        }
        stats_.write_wait_seconds += seconds_since(t0);
        if (!status.is_ok()) break;
        if (!pipeline_read && i + 1 < groups) {
            status = issue_read(group(i + 1), tickets_[(i + 1) % tickets]);
        }
    }
    if (status.is_ok() && pipeline_write) {
        const auto t0 = Clock::now();
        status = tickets_[(groups - 1) % tickets].wait();
        stats_.write_wait_seconds += seconds_since(t0);
    }
    drain();
    stats_.seconds = seconds_since(t_step);
    return status;
}

Status OptimizerSwapper::read_sub_group(std::size_t sub_group, std::span<float> params,
                                        std::span<const std::span<float>> moments) {
    ZINF_ASSERT_LT(sub_group, sub_group_count_);
    ZINF_ASSERT_LE(moments.size(), state_count_ - 1);
    const std::uint64_t numel = sub_group_numel(sub_group);
    ZINF_ASSERT_EQ(params.size(), numel);
    SwapTicket& ticket = tickets_[0];
    Status status = issue_read(sub_group, ticket);
    if (status.is_ok()) status = ticket.wait();
    if (status.is_ok()) {
        std::memcpy(params.data(), ticket.data(0).data(), numel * sizeof(float));
        const OptimizerDescriptor& d = optimizer_descriptor(options_.kind);
        for (std::size_t k = 0; k < moments.size(); ++k) {
            if (moments[k].empty()) continue;
            ZINF_ASSERT_EQ(moments[k].size(), numel);
            kernels::decode_stored_moment(options_.state_dtype, d.moments[k].non_negative,
                                          ticket.data(k + 1), moments[k]);
        }
    }
    drain();
    return status;
}

Status OptimizerSwapper::write_sub_group(std::size_t sub_group, std::span<const float> params,
                                         std::span<const std::span<const float>> moments) {
    ZINF_ASSERT(!speculating_);
    ZINF_ASSERT_LT(sub_group, sub_group_count_);
    ZINF_ASSERT_LE(moments.size(), state_count_ - 1);
    const std::uint64_t numel = sub_group_numel(sub_group);
    ZINF_ASSERT_EQ(params.size(), numel);
    SwapTicket& ticket = tickets_[0];
    PartitionId ids[kMaxStates];
    for (std::size_t k = 0; k < state_count_; ++k) ids[k] = partition(sub_group, k);
    auto n = swapper_->prepare(std::span<const PartitionId>(ids, state_count_), ticket);
    Status status = n.has_value() ? Status::ok() : n.error();
    if (status.is_ok()) {
        ZINF_ASSERT_EQ(*n, state_count_);
        const OptimizerDescriptor& d = optimizer_descriptor(options_.kind);
        auto put = [&](std::size_t k, std::span<const float> from) {
            std::span<std::byte> to = ticket.data(k);
            if (from.empty()) {
                std::memset(to.data(), 0, to.size());
                return;
            }
            ZINF_ASSERT_EQ(from.size(), numel);
            if (k == 0) {
                std::memcpy(to.data(), from.data(), numel * sizeof(float));
            } else {
                kernels::encode_stored_moment(options_.state_dtype, d.moments[k - 1].non_negative,
                                              from, to);
            }
        };
        put(0, params);
        for (std::size_t k = 1; k < state_count_; ++k) {
            put(k, k - 1 < moments.size() ? moments[k - 1] : std::span<const float>());
        }
        status = swapper_->write_back(ticket);
        if (status.is_ok()) status = ticket.wait();
    }
    drain();
    return status;
}

}  // namespace zinf::swap
