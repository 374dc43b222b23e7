// ParameterCoordinator: owns a rank's parameters and gradients on the device under ZeRO stage 0-3
// and serves them to the model one parameter at a time. fetch() makes a parameter readable in
// fp32 (a lookup for stages 0-2, an all-gather of the partitions for stage 3), release() ends the
// use (stage 3 frees the gathered copy unless the parameter is persistent), accumulate_gradient()
// reduces a gradient into the rank's share (reduce-scatter for stages 2-3). At the gradient
// accumulation boundary the optimizer reads and writes the "optimizer domain" (stage 0: every
// element; stages 1-3: the rank's flat partition) and publish_parameters() makes the new values
// visible to the next forward (all-gather for stages 1-2).
//
// Every collective goes through the Communicator, so several ranks need a communicator backend,
// not a new path; today's single-rank communicator turns each collective into a copy or nothing.
// The first training step records the order of fetches (trace()), for prefetching by a tiered
// store underneath (not yet: with parameters on the device, a fetch is a device copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "src/base/aligned.h"
#include "src/base/compute.h"
#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/base/dtype.h"
#include "src/base/status.h"
#include "zero/communicator.h"
#include "zero/gradient_storage.h"
#include "zero/partition.h"
#include "zero/partition_storage.h"

namespace zinf::zero {

struct CoordinatorOptions {
    int stage = 0;
    // Storage of parameters and gradients on the device: fp32, or bf16/fp16 (the model computes
    // in fp32 on values rounded to this dtype).
    DType dtype = DType::kFloat32;
    // Stage 3: parameters of at most this many elements stay gathered between uses.
    std::size_t persistence_threshold_numel = 100'000;
    // Stage 3: more gathered elements than this at once is reported (peak_live_numel) and logged
    // once; modules hold what they fetch, so the coordinator cannot refuse.
    std::size_t max_live_parameters_numel = 1'000'000'000;
    // Stage 3 with `offload_param`: the rank's parameter partition lives in this storage
    // (borrowed, outlives the coordinator) instead of device memory; null: on the device.
    PartitionStorage* offloaded_parameters = nullptr;
    // The rank's gradient partition (the optimizer domain's gradients) in host memory outside
    // the device budget, as DeepSpeed keeps it under optimizer offload. CPU device only (its
    // memory is host memory, so the device's compute reads it in place).
    bool host_gradients = false;
    // Stages 2-3: each reduced gradient slice goes to this storage (borrowed, outlives the
    // coordinator) instead of a partition buffer, and domain().gradients is null; the optimizer
    // reads the gradients from the storage. Null: in memory.
    GradientStorage* gradient_storage = nullptr;
    // Each parameter is padded to a multiple of world_size times this (Partitioning::create):
    // kStateBlockNumel under compressed optimizer states, else Partitioning::kAlignNumel.
    std::size_t partition_align_numel = Partitioning::kAlignNumel;
};

// The bytes one rank holds for the model's parameters and gradients, wherever they live (device,
// host or the offloaded partition storage), by the ZeRO accounting: `parameters` and `gradients`
// are what the seed's formulas count (b bytes per element of the full layout, or of the rank's
// partition where the stage partitions it; padding included), `*_staging` a partition copy kept
// besides the full layout (stage 1's reduced gradient slices over several ranks, or in host
// memory under offload), `working` the fp32 copies and scratch the model computes with.
struct MemoryHeld {
    std::size_t parameters = 0;
    std::size_t parameter_staging = 0;
    std::size_t gradients = 0;
    std::size_t gradient_staging = 0;
    std::size_t working = 0;
};

// The optimizer's view of the rank's share, in device memory, valid until the coordinator dies.
struct OptimizerDomain {
    std::size_t numel = 0;
    DType dtype = DType::kFloat32;
    void* gradients = nullptr;  // numel values of dtype (after reduce_gradients)
    // numel values of dtype: the optimizer writes new values here; null when the parameters are
    // offloaded, or when stages 1-2 over several ranks keep the rank's slices in the full layout
    // (write_domain_parameters reaches them wherever they are).
    void* parameters = nullptr;
};

class ParameterCoordinator {
public:
    // `numels`: the parameters in model order. device, compute and communicator are borrowed and
    // outlive the coordinator. Allocates every persistent buffer now (kNoSpace from the device
    // budget, naming the buffer). Errors: kInvalidArgument for a bad stage or world.
    static Result<std::unique_ptr<ParameterCoordinator>> create(std::span<const std::size_t> numels,
                                                                const CoordinatorOptions& options,
                                                                Device& device, Compute& compute,
                                                                Communicator& communicator);
    ~ParameterCoordinator();
    ParameterCoordinator(const ParameterCoordinator&) = delete;
    ParameterCoordinator& operator=(const ParameterCoordinator&) = delete;

    const Partitioning& partitioning() const noexcept { return partitioning_; }
    const StagePlan& plan() const noexcept { return plan_; }
    DType dtype() const noexcept { return options_.dtype; }

    // Fills parameters from fp32 values: `values(index, offset, out)` writes elements [offset,
    // offset + out.size()) of parameter `index` (host memory). Only the rank's elements are asked
    // for under stage 3. Values are rounded to dtype(). Blocks; allocates a host staging buffer.
    using InitialValues =
        std::function<void(std::size_t index, std::size_t offset, std::span<float> out)>;
    Status initialize(const InitialValues& values, StreamId stream);

    // ---- the model's side ----------------------------------------------------------------------
    // fp32 values of parameter `index` (numel of them) readable on `stream` until the matching
    // release. Errors: kNoSpace (stage 3 gather buffer), the communicator's and device's errors.
    Result<const float*> fetch(std::size_t index, StreamId stream);
    Status release(std::size_t index, StreamId stream);
    // Adds `grad` (numel fp32 values of parameter `index`, device memory) into the rank's share of
    // its gradient, rounded to dtype(). Consumed on `stream` before returning.
    Status accumulate_gradient(std::size_t index, const float* grad, StreamId stream);
    // Starts a new accumulation window: the next gradient of each parameter overwrites.
    void begin_accumulation() noexcept;

    // ---- the optimizer's side ------------------------------------------------------------------
    // Reduces gradients over the ranks (all-reduce for stages 0-1, done per gradient for 2-3) and
    // lays the optimizer's share out contiguously in domain().gradients. Parameters that got no
    // gradient in the window have zero gradient.
    Status reduce_gradients(StreamId stream);
    const OptimizerDomain& domain() const noexcept { return domain_; }
    // After the optimizer wrote domain().parameters: all-gathers them (stages 1-2) and refreshes
    // the fp32 copies the model reads.
    Status publish_parameters(StreamId stream);
    // Host-side access to the domain's parameters (values of dtype()), wherever they live:
    // elements [offset_numel, offset_numel + bytes / dtype size). Blocks until done.
    // `staged`: offloaded parameters whose slices `bytes` covers whole are staged instead
    // (PartitionStorage::write_staged): their next read copies them from `bytes`, which must
    // stay unchanged until take_staged_parameters(). Elsewhere it writes at once.
    Status write_domain_parameters(std::size_t offset_numel, std::span<const std::byte> bytes,
                                   StreamId stream, bool staged = false);
    Status read_domain_parameters(std::size_t offset_numel, std::span<std::byte> bytes,
                                  StreamId stream);
    Status take_staged_parameters();
    bool parameters_offloaded() const noexcept { return options_.offloaded_parameters != nullptr; }
    bool gradients_on_host() const noexcept { return options_.host_gradients; }
    // Stage 3: frees every gathered copy (persistent ones included), so that the next window
    // fetches every parameter in its usual order. Precondition: nothing fetched.
    Status drop_gathered(StreamId stream);
    // One access-order iteration of the offloaded partitions (forward and backward of an
    // accumulation window): forwarded to the PartitionStorage, which records and replays the
    // order (offload_param nvme); nothing without offloaded parameters.
    void begin_iteration();
    void end_iteration();
    // After evaluation forwards, outside iterations: with offloaded parameters, drops the
    // gathered copies, since persistent parameters gathered here would shorten the next
    // window's fetch sequence, which the storage would take for a change of access order.
    Status end_evaluation(StreamId stream);
    // Where parameter `index`'s slice sits in the domain (offset, numel of real elements).
    std::size_t domain_offset_numel(std::size_t index) const;
    std::size_t domain_valid_numel(std::size_t index) const;

    // ---- figures -------------------------------------------------------------------------------
    // Fetch order of the first window (parameter indices), complete once the second window began.
    std::span<const std::uint32_t> trace() const noexcept { return trace_; }
    bool trace_complete() const noexcept { return trace_complete_; }
    std::size_t live_numel() const noexcept { return live_numel_; }
    std::size_t peak_live_numel() const noexcept { return peak_live_numel_; }
    std::uint64_t fetch_count() const noexcept { return fetch_count_; }
    std::uint64_t gathered_bytes() const noexcept { return gathered_bytes_; }
    // Stage 3: gathered copies allocated from the device, and those served from a released one
    // of the same size (a reused copy costs no allocation, and on a GPU no cudaFree, which waits
    // for the whole device, prefetch copies included).
    std::uint64_t working_allocations() const noexcept { return working_allocations_; }
    std::uint64_t working_reuses() const noexcept { return working_reuses_; }
    // Device bytes held persistently (parameters, gradients, staging).
    std::size_t persistent_bytes() const noexcept { return persistent_bytes_; }
    // This rank's parameter and gradient bytes by the ZeRO accounting (see MemoryHeld); the
    // working figure counts stage 3's gathered copies at their peak.
    MemoryHeld memory_held() const noexcept;

private:
    struct ParamState {
        std::uint32_t fetches = 0;
        bool persistent = false;
        bool gathered = false;  // stage 3: working holds current values
        DeviceBuffer working;   // stage 3: fp32 gathered values (padded_numel)
        bool grad_written = false;
    };

    ParameterCoordinator(const Partitioning& partitioning, const CoordinatorOptions& options,
                         Device& device, Compute& compute, Communicator& communicator);
    Result<std::byte*> allocate(std::size_t size_bytes, const char* what);
    // create's steps: the options' consistency, then the buffers each stage keeps.
    static Status check_options(const CoordinatorOptions& options, const Device& device);
    Status allocate_parameters();
    Status allocate_gradients();
    Status allocate_scratch();
    void set_domain() noexcept;
    Status gather(std::size_t index, StreamId stream);
    // Stage 3's gathered copies: a released one of the same size, else a new allocation. Spares
    // come only from released copies and are kept only while the gathered copies and spares
    // together stay within the peak the gathered copies alone reached, so reuse never raises the
    // device memory held; they are freed when an allocation meets kNoSpace, and at destruction.
    Result<DeviceBuffer> take_working(std::size_t size_bytes);
    void give_back_working(DeviceBuffer buffer) noexcept;
    void free_spares(std::size_t keep_bytes) noexcept;
    // Calls fn(index, offset_in_slice_numel, offset_in_range_numel, numel) for every parameter
    // slice overlapping domain elements [offset_numel, offset_numel + numel) (stage 3 layout).
    template <typename Fn>
    Status for_each_slice(std::size_t offset_numel, std::size_t numel, Fn fn) const;
    std::size_t elem_bytes() const noexcept { return dtype_size_bytes(options_.dtype); }
    // Where this rank's slice of parameter `index` starts in the full layout.
    std::size_t full_slice_offset(std::size_t index) const noexcept {
        const auto& s = partitioning_.slot(index);
        return s.full_offset_numel + static_cast<std::size_t>(partitioning_.rank()) * s.slice_numel;
    }
    std::byte* at(void* base, std::size_t offset_numel) const noexcept {
        return static_cast<std::byte*>(base) + offset_numel * elem_bytes();
    }

    Partitioning partitioning_;
    StagePlan plan_;
    CoordinatorOptions options_;
    Device& device_;
    Compute& compute_;
    Communicator& communicator_;
    std::vector<DeviceBuffer> owned_;  // persistent buffers; the raw pointers below view them
    AlignedBuffer host_grads_;         // host_gradients: the gradient partition

    // Device arrays of options_.dtype elements (bytes; at() indexes them by element), viewing
    // owned_ or host_grads_.
    std::byte* full_params_ = nullptr;       // stages 0-2: full layout
    float* full_working_ = nullptr;          // stages 0-2, 16-bit dtype: fp32 copy of full_params_
    std::byte* partition_params_ = nullptr;  // stages 1-3: rank's partition
    std::byte* full_grads_ = nullptr;        // stages 0-1: full layout
    std::byte* partition_grads_ = nullptr;   // stages 1-3: rank's partition
    std::byte* stage_scratch_ = nullptr;     // max padded numel: a gradient before reduction
    std::byte* slice_scratch_ = nullptr;     // max slice numel
    float* fp32_scratch_a_ = nullptr;        // max padded numel, fp32
    float* fp32_scratch_b_ = nullptr;

    OptimizerDomain domain_;
    std::vector<ParamState> params_;
    std::vector<std::uint32_t> trace_;
    bool trace_complete_ = false;
    std::uint64_t windows_ = 0;
    std::size_t live_numel_ = 0;
    std::size_t peak_live_numel_ = 0;
    std::uint64_t fetch_count_ = 0;
    std::uint64_t gathered_bytes_ = 0;
    std::size_t persistent_bytes_ = 0;
    bool warned_live_ = false;
    std::vector<DeviceBuffer> spares_;  // released gathered copies, oldest first
    std::size_t spare_bytes_ = 0;       // as the device charges them (charged())
    // The gathered copies as the device charges them, now and at their peak.
    std::size_t live_charged_bytes_ = 0;
    std::size_t peak_live_charged_bytes_ = 0;
    std::size_t charged(std::size_t bytes) const noexcept {
        return align_up(bytes, device_.allocation_granularity_bytes());
    }
    std::uint64_t working_allocations_ = 0;
    std::uint64_t working_reuses_ = 0;
};

}  // namespace zinf::zero
