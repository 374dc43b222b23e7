// ParameterCoordinator: the stage 0-3 paths over one Communicator.
#include "zero/parameter_coordinator.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/base/log.h"

namespace zinf::zero {

ParameterCoordinator::ParameterCoordinator(const Partitioning& partitioning,
                                           const CoordinatorOptions& options, Device& device,
                                           Compute& compute, Communicator& communicator)
    : partitioning_(partitioning),
      plan_(StagePlan::for_stage(options.stage)),
      options_(options),
      device_(device),
      compute_(compute),
      communicator_(communicator),
      params_(partitioning.parameter_count()) {}

ParameterCoordinator::~ParameterCoordinator() {
    // The device buffers (gathered copies, spares, owned) free themselves.
    if (partition_grads_ != nullptr && partition_grads_ == host_grads_.data()) {
        (void)device_.unregister_host_memory(host_grads_.data());
    }
}

Result<std::byte*> ParameterCoordinator::allocate(std::size_t size_bytes, const char* what) {
    if (size_bytes == 0) size_bytes = 64;
    ZINF_ASSIGN_OR_RETURN(
        DeviceBuffer buffer,
        DeviceBuffer::allocate(device_, size_bytes, str_cat("zero: ", what).c_str()));
    auto* ptr = static_cast<std::byte*>(buffer.data());
    owned_.push_back(std::move(buffer));
    persistent_bytes_ += size_bytes;
    ZINF_TRY(device_.fill_zero(ptr, size_bytes, 0));
    return ptr;
}

Status ParameterCoordinator::check_options(const CoordinatorOptions& options,
                                           const Device& device) {
    if (options.stage < 0 || options.stage > 3) {
        return Status::invalid_argument("zero_optimization.stage: expected 0..3, got " +
                                        std::to_string(options.stage));
    }
    if (options.offloaded_parameters != nullptr && options.stage != 3) {
        return Status::invalid_argument(
            "zero_optimization.offload_param: parameters are offloaded only under stage 3, got "
            "stage " +
            std::to_string(options.stage));
    }
    if (options.host_gradients && device.kind() != DeviceKind::kCpu) {
        return Status::not_supported(
            "zero: host-resident gradient partitions are implemented for the CPU device only");
    }
    const StagePlan plan = StagePlan::for_stage(options.stage);
    if (options.gradient_storage != nullptr && !plan.gradients_partitioned) {
        return Status::invalid_argument(
            "zero: streamed gradients need partitioned gradients (stage 2-3)");
    }
    if (options.host_gradients && !plan.optimizer_partitioned) {
        return Status::invalid_argument(
            "zero: host-resident gradients need a partitioned optimizer (stage 1-3)");
    }
    return Status::ok();
}

Result<std::unique_ptr<ParameterCoordinator>> ParameterCoordinator::create(
    std::span<const std::size_t> numels, const CoordinatorOptions& options, Device& device,
    Compute& compute, Communicator& communicator) {
    ZINF_TRY(check_options(options, device));
    ZINF_ASSIGN_OR_RETURN(auto partitioning,
                          Partitioning::create(numels, communicator.world_size(),
                                               communicator.rank(), options.partition_align_numel));
    std::unique_ptr<ParameterCoordinator> c(
        new ParameterCoordinator(partitioning, options, device, compute, communicator));
    for (std::size_t i = 0; i < partitioning.parameter_count(); ++i) {
        c->params_[i].persistent =
            options.stage == 3 && partitioning.slot(i).numel <= options.persistence_threshold_numel;
    }
    ZINF_TRY(c->allocate_parameters());
    ZINF_TRY(c->allocate_gradients());
    ZINF_TRY(c->allocate_scratch());
    ZINF_TRY(device.synchronize(0));
    c->set_domain();
    return c;
}

// Stages 0-2: the full layout (and its fp32 copy for a 16-bit dtype). Stages 1-2 keep no
// partition copy of the parameters: the rank's slices live in the full layout, where the
// optimizer's writes go (write_domain_parameters) and the all-gather fills in the other ranks'
// slices in place. With one rank the partition is the full layout. Stage 3 keeps its partition
// unless the parameters are offloaded.
Status ParameterCoordinator::allocate_parameters() {
    const std::size_t eb = elem_bytes();
    if (!plan_.parameters_partitioned) {
        ZINF_ASSIGN_OR_RETURN(full_params_,
                              allocate(partitioning_.full_numel() * eb, "parameters"));
        if (options_.dtype != DType::kFloat32) {
            ZINF_ASSIGN_OR_RETURN(std::byte * w,
                                  allocate(partitioning_.full_numel() * 4, "fp32 parameters"));
            full_working_ = reinterpret_cast<float*>(w);
        }
    }
    if (!plan_.optimizer_partitioned) return Status::ok();
    if (plan_.parameters_partitioned && options_.offloaded_parameters == nullptr) {
        ZINF_ASSIGN_OR_RETURN(partition_params_, allocate(partitioning_.partition_numel() * eb,
                                                          "parameter partition"));
    } else if (!plan_.parameters_partitioned && partitioning_.world_size() == 1) {
        partition_params_ = full_params_;
    }
    return Status::ok();
}

// The optimizer domain's gradients where the options put them: a gradient storage (streamed:
// nothing here), registered host memory (host_gradients), the device; and the full layout under
// stages 0-1 (on one rank under stage 1 the partition is the full layout).
Status ParameterCoordinator::allocate_gradients() {
    const std::size_t eb = elem_bytes();
    const bool one_rank = partitioning_.world_size() == 1;
    if (plan_.optimizer_partitioned && options_.gradient_storage == nullptr) {
        if (options_.host_gradients) {
            const std::size_t bytes =
                std::max<std::size_t>(partitioning_.partition_numel() * eb, 64);
            auto host = AlignedBuffer::allocate(bytes);
            if (!host.has_value())
                return host.error().with_context("zero: host gradient partition");
            host_grads_ = std::move(*host);
            std::memset(host_grads_.data(), 0, bytes);
            // The CPU device then treats it as its own memory, outside the budget.
            ZINF_TRY(device_.register_host_memory(std::span<std::byte>(host_grads_.data(), bytes))
                         .with_context("zero: host gradient partition"));
            partition_grads_ = host_grads_.data();
        } else if (plan_.gradients_partitioned || !one_rank) {
            ZINF_ASSIGN_OR_RETURN(partition_grads_, allocate(partitioning_.partition_numel() * eb,
                                                             "gradient partition"));
        }
    }
    if (!plan_.gradients_partitioned) {
        ZINF_ASSIGN_OR_RETURN(full_grads_, allocate(partitioning_.full_numel() * eb, "gradients"));
        if (plan_.optimizer_partitioned && partition_grads_ == nullptr &&
            options_.gradient_storage == nullptr) {
            partition_grads_ = full_grads_;
        }
    }
    return Status::ok();
}

// The staging of one gradient before its reduction, its slice, and fp32 work space (two for a
// 16-bit dtype), each the size of the largest parameter.
Status ParameterCoordinator::allocate_scratch() {
    const std::size_t eb = elem_bytes();
    std::size_t max_padded = 0;
    std::size_t max_slice = 0;
    for (std::size_t i = 0; i < partitioning_.parameter_count(); ++i) {
        max_padded = std::max(max_padded, partitioning_.slot(i).padded_numel);
        max_slice = std::max(max_slice, partitioning_.slot(i).slice_numel);
    }
    ZINF_ASSIGN_OR_RETURN(stage_scratch_, allocate(max_padded * eb, "gradient staging"));
    if (plan_.gradients_partitioned) {
        ZINF_ASSIGN_OR_RETURN(slice_scratch_, allocate(max_slice * eb, "gradient slice"));
    }
    ZINF_ASSIGN_OR_RETURN(std::byte * a, allocate(max_padded * 4, "fp32 scratch"));
    fp32_scratch_a_ = reinterpret_cast<float*>(a);
    if (options_.dtype != DType::kFloat32) {
        ZINF_ASSIGN_OR_RETURN(std::byte * b, allocate(max_padded * 4, "fp32 scratch"));
        fp32_scratch_b_ = reinterpret_cast<float*>(b);
    }
    return Status::ok();
}

void ParameterCoordinator::set_domain() noexcept {
    domain_.dtype = options_.dtype;
    if (plan_.optimizer_partitioned) {
        domain_.numel = partitioning_.partition_numel();
        domain_.gradients = partition_grads_;
        domain_.parameters = partition_params_;
    } else {
        domain_.numel = partitioning_.full_numel();
        domain_.gradients = full_grads_;
        domain_.parameters = full_params_;
    }
}

MemoryHeld ParameterCoordinator::memory_held() const noexcept {
    const std::size_t eb = elem_bytes();
    const std::size_t full = partitioning_.full_numel() * eb;
    const std::size_t partition = partitioning_.partition_numel() * eb;
    MemoryHeld m;
    m.parameters = plan_.parameters_partitioned ? partition : full;
    m.parameter_staging = partition_params_ != nullptr && partition_params_ != full_params_ &&
                                  !plan_.parameters_partitioned
                              ? partition
                              : 0;
    m.gradients = plan_.gradients_partitioned ? partition : full;
    m.gradient_staging = partition_grads_ != nullptr && partition_grads_ != full_grads_ &&
                                 !plan_.gradients_partitioned
                             ? partition
                             : 0;
    // Everything else the coordinator allocated (fp32 copies, scratch), and stage 3's gathered
    // copies at their peak.
    std::size_t counted = 0;
    if (full_params_ != nullptr) counted += full;
    if (partition_params_ != nullptr && partition_params_ != full_params_) counted += partition;
    if (full_grads_ != nullptr) counted += full;
    if (partition_grads_ != nullptr && partition_grads_ != full_grads_ &&
        partition_grads_ != host_grads_.data()) {
        counted += partition;
    }
    m.working = persistent_bytes_ - std::min(persistent_bytes_, counted) + peak_live_numel_ * 4;
    return m;
}

template <typename Fn>
Status ParameterCoordinator::for_each_slice(std::size_t offset_numel, std::size_t numel,
                                            Fn fn) const {
    const std::size_t end = offset_numel + numel;
    for (std::size_t i = 0; i < partitioning_.parameter_count(); ++i) {
        const auto& s = partitioning_.slot(i);
        const std::size_t lo = std::max(offset_numel, s.partition_offset_numel);
        const std::size_t hi = std::min(end, s.partition_offset_numel + s.slice_numel);
        if (lo >= hi) continue;
        ZINF_TRY(fn(i, lo - s.partition_offset_numel, lo - offset_numel, hi - lo));
    }
    return Status::ok();
}

Status ParameterCoordinator::write_domain_parameters(std::size_t offset_numel,
                                                     std::span<const std::byte> bytes,
                                                     StreamId stream, bool staged) {
    const std::size_t eb = elem_bytes();
    ZINF_ASSERT_EQ(bytes.size() % eb, 0u);
    const std::size_t numel = bytes.size() / eb;
    ZINF_ASSERT_LE(offset_numel + numel, domain_.numel);
    PartitionStorage* storage = options_.offloaded_parameters;
    if (storage == nullptr && domain_.parameters != nullptr) {
        ZINF_TRY(device_.copy_to_device(at(domain_.parameters, offset_numel), bytes.data(),
                                        bytes.size(), stream));
        return device_.synchronize(stream);
    }
    if (storage == nullptr) {  // stages 1-2 over several ranks: the slices in the full layout
        ZINF_TRY(for_each_slice(
            offset_numel, numel,
            [&](std::size_t index, std::size_t in_slice, std::size_t in_range, std::size_t n) {
                return device_.copy_to_device(at(full_params_, full_slice_offset(index) + in_slice),
                                              bytes.data() + in_range * eb, n * eb, stream);
            }));
        return device_.synchronize(stream);
    }
    return for_each_slice(
        offset_numel, numel,
        [&](std::size_t index, std::size_t in_slice, std::size_t in_range, std::size_t n) {
            const auto piece = bytes.subspan(in_range * eb, n * eb);
            if (staged && in_slice == 0 && n == partitioning_.slot(index).slice_numel) {
                return storage->write_staged(index, piece);
            }
            return storage->write(index, in_slice * eb, piece);
        });
}

Status ParameterCoordinator::take_staged_parameters() {
    PartitionStorage* storage = options_.offloaded_parameters;
    return storage == nullptr ? Status::ok() : storage->take_staged();
}

Status ParameterCoordinator::read_domain_parameters(std::size_t offset_numel,
                                                    std::span<std::byte> bytes, StreamId stream) {
    const std::size_t eb = elem_bytes();
    ZINF_ASSERT_EQ(bytes.size() % eb, 0u);
    const std::size_t numel = bytes.size() / eb;
    ZINF_ASSERT_LE(offset_numel + numel, domain_.numel);
    PartitionStorage* storage = options_.offloaded_parameters;
    if (storage == nullptr && domain_.parameters != nullptr) {
        ZINF_TRY(device_.copy_to_host(bytes.data(), at(domain_.parameters, offset_numel),
                                      bytes.size(), stream));
        return device_.synchronize(stream);
    }
    if (storage == nullptr) {  // stages 1-2 over several ranks: the slices in the full layout
        ZINF_TRY(for_each_slice(
            offset_numel, numel,
            [&](std::size_t index, std::size_t in_slice, std::size_t in_range, std::size_t n) {
                return device_.copy_to_host(bytes.data() + in_range * eb,
                                            at(full_params_, full_slice_offset(index) + in_slice),
                                            n * eb, stream);
            }));
        return device_.synchronize(stream);
    }
    return for_each_slice(
        offset_numel, numel,
        [&](std::size_t index, std::size_t in_slice, std::size_t in_range, std::size_t n) {
            return storage->read(index, in_slice * eb, bytes.subspan(in_range * eb, n * eb));
        });
}

std::size_t ParameterCoordinator::domain_offset_numel(std::size_t index) const {
    const auto& s = partitioning_.slot(index);
    return plan_.optimizer_partitioned ? s.partition_offset_numel : s.full_offset_numel;
}

std::size_t ParameterCoordinator::domain_valid_numel(std::size_t index) const {
    const auto& s = partitioning_.slot(index);
    return plan_.optimizer_partitioned ? s.valid_numel(partitioning_.rank()) : s.numel;
}

Status ParameterCoordinator::initialize(const InitialValues& values, StreamId stream) {
    std::size_t max_padded = 0;
    for (std::size_t i = 0; i < partitioning_.parameter_count(); ++i) {
        max_padded = std::max(max_padded, partitioning_.slot(i).padded_numel);
    }
    std::vector<float> staging(max_padded);
    std::vector<std::byte> narrow_staging;
    PartitionStorage* storage = options_.offloaded_parameters;
    if (storage != nullptr) narrow_staging.resize(max_padded * elem_bytes());
    const int rank = partitioning_.rank();
    for (std::size_t i = 0; i < partitioning_.parameter_count(); ++i) {
        const auto& s = partitioning_.slot(i);
        std::fill(staging.begin(), staging.end(), 0.0f);
        void* dst = nullptr;
        std::size_t n = 0;
        if (plan_.parameters_partitioned) {
            const std::size_t valid = s.valid_numel(rank);
            if (valid > 0) {
                values(i, static_cast<std::size_t>(rank) * s.slice_numel,
                       std::span<float>(staging.data(), valid));
            }
            dst = storage != nullptr ? stage_scratch_
                                     : at(partition_params_, s.partition_offset_numel);
            n = s.slice_numel;
        } else {
            values(i, 0, std::span<float>(staging.data(), s.numel));
            dst = at(full_params_, s.full_offset_numel);
            n = s.padded_numel;
        }
        ZINF_TRY(device_.copy_to_device(fp32_scratch_a_, staging.data(), n * 4, stream));
        ZINF_TRY(compute_.cast(fp32_scratch_a_, DType::kFloat32, dst, options_.dtype, n, stream));
        if (storage != nullptr) {
            const std::size_t bytes = n * elem_bytes();
            ZINF_TRY(device_.copy_to_host(narrow_staging.data(), dst, bytes, stream));
            ZINF_TRY(device_.synchronize(stream));
            ZINF_TRY(storage->write(i, 0, std::span<const std::byte>(narrow_staging.data(), bytes))
                         .with_context("initial values of parameter " + std::to_string(i)));
        }
        // The staging vector is reused: wait before overwriting it.
        ZINF_TRY(device_.synchronize(stream));
    }
    if (full_working_ != nullptr) {
        ZINF_TRY(compute_.cast(full_params_, options_.dtype, full_working_, DType::kFloat32,
                               partitioning_.full_numel(), stream));
    }
    return device_.synchronize(stream);
}

Status ParameterCoordinator::gather(std::size_t index, StreamId stream) {
    const auto& s = partitioning_.slot(index);
    auto& p = params_[index];
    ZINF_ASSERT(!p.gathered);
    ZINF_ASSERT(p.working.data() == nullptr);
    const std::size_t working_bytes = s.padded_numel * 4;
    auto ptr = take_working(working_bytes);
    if (!ptr.has_value()) {
        return ptr.error().with_context("zero stage 3: gathering parameter " +
                                        std::to_string(index));
    }
    p.working = std::move(*ptr);
    PartitionStorage* storage = options_.offloaded_parameters;
    const void* slice = nullptr;
    if (storage != nullptr) {
        auto got = storage->begin_read(index, stream);
        if (!got.has_value()) {
            // Freed, not kept: a spare comes only from a released copy, which keeps the bound.
            p.working.reset();
            return got.error().with_context("zero stage 3: reading parameter " +
                                            std::to_string(index));
        }
        slice = *got;
    } else {
        slice = at(partition_params_, s.partition_offset_numel);
    }
    Status status;
    if (options_.dtype == DType::kFloat32) {
        status = communicator_.all_gather(slice, p.working.data(), s.slice_numel, DType::kFloat32,
                                          stream);
    } else {
        status =
            communicator_.all_gather(slice, stage_scratch_, s.slice_numel, options_.dtype, stream);
        if (status.is_ok()) {
            status = compute_.cast(stage_scratch_, options_.dtype, p.working.data(),
                                   DType::kFloat32, s.padded_numel, stream);
        }
    }
    if (storage != nullptr) {
        const Status ended = storage->end_read(index, stream);
        if (status.is_ok()) status = ended;
    }
    if (!status.is_ok()) {
        (void)device_.synchronize(stream);
        p.working.reset();
        return status;
    }
    p.gathered = true;
    gathered_bytes_ += s.padded_numel * elem_bytes();
    live_numel_ += s.padded_numel;
    peak_live_numel_ = std::max(peak_live_numel_, live_numel_);
    live_charged_bytes_ += charged(working_bytes);
    peak_live_charged_bytes_ = std::max(peak_live_charged_bytes_, live_charged_bytes_);
    if (live_numel_ > options_.max_live_parameters_numel && !warned_live_) {
        warned_live_ = true;
        log::warning("zero stage 3: ", live_numel_,
                     " parameter elements gathered at once, above stage3_max_live_parameters ",
                     options_.max_live_parameters_numel);
    }
    return Status::ok();
}

Result<const float*> ParameterCoordinator::fetch(std::size_t index, StreamId stream) {
    ZINF_ASSERT_LT(index, params_.size());
    auto& p = params_[index];
    const auto& s = partitioning_.slot(index);
    if (!trace_complete_) trace_.push_back(static_cast<std::uint32_t>(index));
    ++fetch_count_;
    if (!plan_.parameters_partitioned) {
        ++p.fetches;
        if (options_.dtype == DType::kFloat32) {
            return reinterpret_cast<const float*>(at(full_params_, s.full_offset_numel));
        }
        return full_working_ + s.full_offset_numel;
    }
    if (!p.gathered) ZINF_TRY(gather(index, stream));
    ++p.fetches;
    return p.working.as<const float>();
}

Status ParameterCoordinator::release(std::size_t index, StreamId stream) {
    ZINF_ASSERT_LT(index, params_.size());
    auto& p = params_[index];
    ZINF_ASSERT_GT(p.fetches, 0u);
    --p.fetches;
    if (!plan_.parameters_partitioned || p.fetches > 0 || p.persistent) return Status::ok();
    // The copy may be handed to the next gather at once, on any stream: wait for its readers.
    ZINF_TRY(device_.synchronize(stream));
    give_back_working(std::move(p.working));
    p.gathered = false;
    live_numel_ -= partitioning_.slot(index).padded_numel;
    live_charged_bytes_ -= charged(partitioning_.slot(index).padded_numel * 4);
    return Status::ok();
}

Result<DeviceBuffer> ParameterCoordinator::take_working(std::size_t size_bytes) {
    // The most recently released copy of this size (likeliest still in cache).
    for (std::size_t i = spares_.size(); i-- > 0;) {
        if (spares_[i].size_bytes() != size_bytes) continue;
        DeviceBuffer reused = std::move(spares_[i]);
        spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
        spare_bytes_ -= charged(size_bytes);
        ++working_reuses_;
        return reused;
    }
    // None fits: keep only the spares that, with the copies gathered and this new one, stay
    // within the peak the gathered copies reached (or reach now).
    // In the bytes the device charges (rounded up per allocation), so that the bound holds in
    // the device's own count, which admission predicts (src/engine/memory_prediction.h).
    const std::size_t live_bytes = live_charged_bytes_;
    const std::size_t new_bytes = charged(size_bytes);
    const std::size_t peak_bytes = std::max(peak_live_charged_bytes_, live_bytes + new_bytes);
    free_spares(peak_bytes - live_bytes - new_bytes);
    auto buffer = DeviceBuffer::allocate(device_, size_bytes, "gathered parameter");
    if (!buffer.has_value() && buffer.error().code() == StatusCode::kNoSpace && !spares_.empty()) {
        free_spares(0);  // the budget is tight: give everything back and try once more
        buffer = DeviceBuffer::allocate(device_, size_bytes, "gathered parameter");
    }
    if (!buffer.has_value()) return buffer.error();
    ++working_allocations_;
    return std::move(buffer).value();
}

void ParameterCoordinator::give_back_working(DeviceBuffer buffer) noexcept {
    spare_bytes_ += charged(buffer.size_bytes());
    spares_.push_back(std::move(buffer));
}

void ParameterCoordinator::free_spares(std::size_t keep_bytes) noexcept {
    std::size_t drop = 0;
    while (drop < spares_.size() && spare_bytes_ > keep_bytes) {
        spare_bytes_ -= charged(spares_[drop].size_bytes());
        spares_[drop].reset();
        ++drop;
    }
    spares_.erase(spares_.begin(), spares_.begin() + static_cast<std::ptrdiff_t>(drop));
}

void ParameterCoordinator::begin_accumulation() noexcept {
    for (auto& p : params_) p.grad_written = false;
    ++windows_;
    if (windows_ >= 2) trace_complete_ = true;
}

Status ParameterCoordinator::accumulate_gradient(std::size_t index, const float* grad,
                                                 StreamId stream) {
    ZINF_ASSERT_LT(index, params_.size());
    const auto& s = partitioning_.slot(index);
    auto& p = params_[index];
    const DType dt = options_.dtype;
    const std::size_t eb = elem_bytes();
    ZINF_TRY(compute_.cast(grad, DType::kFloat32, stage_scratch_, dt, s.numel, stream));
    if (s.padded_numel > s.numel) {
        ZINF_TRY(device_.fill_zero(at(stage_scratch_, s.numel), (s.padded_numel - s.numel) * eb,
                                   stream));
    }
    const void* src = stage_scratch_;
    void* dst = nullptr;
    std::size_t n = 0;
    if (plan_.gradients_partitioned) {
        ZINF_TRY(communicator_.reduce_scatter(stage_scratch_, slice_scratch_, s.slice_numel, dt,
                                              ReduceOp::kSum, stream));
        if (options_.gradient_storage != nullptr) {
            const bool first = !p.grad_written;
            p.grad_written = true;
            return options_.gradient_storage->store(index, slice_scratch_, s.slice_numel, first,
                                                    stream);
        }
        src = slice_scratch_;
        dst = at(partition_grads_, s.partition_offset_numel);
        n = s.slice_numel;
    } else {
        dst = at(full_grads_, s.full_offset_numel);
        n = s.padded_numel;
    }
    if (!p.grad_written) {
        p.grad_written = true;
        return device_.copy_on_device(dst, src, n * eb, stream);
    }
    if (dt == DType::kFloat32) {
        return compute_.axpy(1.0f, static_cast<const float*>(src), static_cast<float*>(dst), n,
                             stream);
    }
    ZINF_TRY(compute_.cast(dst, dt, fp32_scratch_a_, DType::kFloat32, n, stream));
    ZINF_TRY(compute_.cast(src, dt, fp32_scratch_b_, DType::kFloat32, n, stream));
    ZINF_TRY(compute_.axpy(1.0f, fp32_scratch_b_, fp32_scratch_a_, n, stream));
    return compute_.cast(fp32_scratch_a_, DType::kFloat32, dst, dt, n, stream);
}

Status ParameterCoordinator::reduce_gradients(StreamId stream) {
    // Streamed: the storage zero-fills what got no gradient; stages 2-3 reduced everything
    // as it arrived.
    if (options_.gradient_storage != nullptr) return options_.gradient_storage->end_window(stream);
    const std::size_t eb = elem_bytes();
    for (std::size_t i = 0; i < params_.size(); ++i) {
        if (params_[i].grad_written) continue;
        const auto& s = partitioning_.slot(i);
        if (plan_.gradients_partitioned) {
            ZINF_TRY(device_.fill_zero(at(partition_grads_, s.partition_offset_numel),
                                       s.slice_numel * eb, stream));
        } else {
            ZINF_TRY(device_.fill_zero(at(full_grads_, s.full_offset_numel), s.padded_numel * eb,
                                       stream));
        }
    }
    if (!plan_.gradients_partitioned && !plan_.optimizer_partitioned) {
        ZINF_TRY(communicator_.all_reduce(full_grads_, full_grads_, partitioning_.full_numel(),
                                          options_.dtype, ReduceOp::kSum, stream));
    } else if (!plan_.gradients_partitioned) {
        // Stage 1: the rank needs only its slices of the sum (half an all-reduce's traffic).
        for (std::size_t i = 0; i < params_.size(); ++i) {
            const auto& s = partitioning_.slot(i);
            ZINF_TRY(communicator_.reduce_scatter(at(full_grads_, s.full_offset_numel),
                                                  at(partition_grads_, s.partition_offset_numel),
                                                  s.slice_numel, options_.dtype, ReduceOp::kSum,
                                                  stream));
        }
    }
    return Status::ok();
}

Status ParameterCoordinator::publish_parameters(StreamId stream) {
    if (plan_.optimizer_partitioned && !plan_.parameters_partitioned) {
        // In place: this rank's slice is already where the all-gather puts it.
        for (std::size_t i = 0; i < params_.size(); ++i) {
            const auto& s = partitioning_.slot(i);
            ZINF_TRY(communicator_.all_gather(at(full_params_, full_slice_offset(i)),
                                              at(full_params_, s.full_offset_numel), s.slice_numel,
                                              options_.dtype, stream));
        }
    }
    if (full_working_ != nullptr) {
        ZINF_TRY(compute_.cast(full_params_, options_.dtype, full_working_, DType::kFloat32,
                               partitioning_.full_numel(), stream));
    }
    // Persistent parameters hold stale values now: drop them; the next fetch gathers again.
    return drop_gathered(stream);
}

void ParameterCoordinator::begin_iteration() {
    if (options_.offloaded_parameters != nullptr) options_.offloaded_parameters->begin_iteration();
}

void ParameterCoordinator::end_iteration() {
    if (options_.offloaded_parameters != nullptr) options_.offloaded_parameters->end_iteration();
}

Status ParameterCoordinator::end_evaluation(StreamId stream) {
    if (options_.offloaded_parameters == nullptr) return Status::ok();
    return drop_gathered(stream);
}

Status ParameterCoordinator::drop_gathered(StreamId stream) {
    if (!plan_.parameters_partitioned) return Status::ok();
    ZINF_TRY(device_.synchronize(stream));
    for (std::size_t i = 0; i < params_.size(); ++i) {
        auto& p = params_[i];
        ZINF_ASSERT_EQ(p.fetches, 0u);
        if (!p.gathered) continue;
        p.working.reset();
        p.gathered = false;
        live_numel_ -= partitioning_.slot(i).padded_numel;
        live_charged_bytes_ -= charged(partitioning_.slot(i).padded_numel * 4);
    }
    // Spares stay: they hold no values, and the next window's gathers take them.
    return Status::ok();
}

}  // namespace zinf::zero
