// Offload: host and NVMe homes of parameter partitions and optimizer states.
#include "src/engine/offload.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/file_system.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/engine/gradient_swap.h"

namespace zinf::engine {
namespace {

// With `create`, makes missing directories (as DeepSpeed does for its swap folders); then checks
// that each is a writable, trusted directory. Without it, a missing directory's nearest existing
// ancestor is checked instead (the directory could be made there), and nothing is created.
// Errors name the key.
Status check_paths(const std::vector<std::string>& paths, const std::string& key, bool create) {
    for (const auto& p : paths) {
        std::filesystem::path at(p);
        if (!create) {
            std::error_code ec;
            while (!at.empty() && !std::filesystem::exists(at, ec) && at.has_parent_path() &&
                   at.parent_path() != at) {
                at = at.parent_path();
            }
            if (at.empty()) at = ".";
        }
        // Refused here, naming the key, before anything is allocated; RunDir checks again.
        ZINF_TRY(
            io::open_trusted_directory(io::posix_file_system(), at.string(), key, create).status());
    }
    return Status::ok();
}

}  // namespace

Status check_swap_directories(const config::EngineConfig& config, bool create) {
    const auto& zc = config.zero;
    if (zc.offload_param.device == config::OffloadDevice::kNvme) {
        ZINF_TRY(check_paths(zc.offload_param.nvme_path,
                             "zero_optimization.offload_param.nvme_path", create));
    }
    if (zc.offload_optimizer.device == config::OffloadDevice::kNvme) {
        ZINF_TRY(check_paths(zc.offload_optimizer.nvme_path,
                             "zero_optimization.offload_optimizer.nvme_path", create));
    }
    return Status::ok();
}

config::EngineConfig with_rank_swap_paths(const config::EngineConfig& config, int rank) {
    config::EngineConfig c = config;
    const std::string sub = "rank" + std::to_string(rank);
    for (auto* paths : {&c.zero.offload_param.nvme_path, &c.zero.offload_optimizer.nvme_path,
                        &c.activation_checkpointing.nvme_path}) {
        for (auto& p : *paths) p = (std::filesystem::path(p) / sub).string();
    }
    return c;
}

// ---- HostPartitionStorage ----------------------------------------------------------------

Result<std::unique_ptr<HostPartitionStorage>> HostPartitionStorage::create(
    const zero::Partitioning& part, DType dtype, Device& device) {
    // config::load refuses offload_param "cpu" with another device type.
    ZINF_ASSERT(device.kind() == DeviceKind::kCpu);
    std::unique_ptr<HostPartitionStorage> s(new HostPartitionStorage(part, dtype, device));
    const std::size_t bytes =
        std::max<std::size_t>(part.partition_numel() * dtype_size_bytes(dtype), 64);
    ZINF_ASSIGN_OR_RETURN(s->buffer_, AlignedBuffer::allocate(bytes));
    std::memset(s->buffer_.data(), 0, bytes);
    ZINF_TRY(device.register_host_memory(std::span<std::byte>(s->buffer_.data(), bytes))
                 .with_context("offload_param cpu: host partition"));
    return s;
}

HostPartitionStorage::~HostPartitionStorage() {
    if (buffer_.data() != nullptr) (void)device_.unregister_host_memory(buffer_.data());
}

std::byte* HostPartitionStorage::slice(std::size_t index, std::size_t offset_bytes,
                                       std::size_t length) const {
    const auto& s = part_.slot(index);
    const std::size_t eb = dtype_size_bytes(dtype_);
    ZINF_ASSERT_LE(offset_bytes + length, s.slice_numel * eb);
    return const_cast<std::byte*>(buffer_.data()) + s.partition_offset_numel * eb + offset_bytes;
}

Result<const void*> HostPartitionStorage::begin_read(std::size_t index, StreamId) {
    return static_cast<const void*>(slice(index, 0, 0));
}

Status HostPartitionStorage::end_read(std::size_t, StreamId) {
    return Status::ok();
}

Status HostPartitionStorage::write(std::size_t index, std::size_t offset_bytes,
                                   std::span<const std::byte> bytes) {
    std::memcpy(slice(index, offset_bytes, bytes.size()), bytes.data(), bytes.size());
    return Status::ok();
}

Status HostPartitionStorage::read(std::size_t index, std::size_t offset_bytes,
                                  std::span<std::byte> bytes) {
    std::memcpy(bytes.data(), slice(index, offset_bytes, bytes.size()), bytes.size());
    return Status::ok();
}

// ---- TieredPartitionStorage --------------------------------------------------------------

TieredPartitionStorage::TieredPartitionStorage(tier::ResidencyManager& residency,
                                               swap::SwapStore& store, Device& device,
                                               const zero::Partitioning& part, DType dtype,
                                               AlignedBuffer staging)
    : residency_(residency),
      store_(store),
      device_(device),
      part_(part),
      dtype_(dtype),
      staging_(std::move(staging)),
      written_(part.parameter_count(), false) {}

Result<const void*> TieredPartitionStorage::begin_read(std::size_t index, StreamId) {
    ZINF_ASSERT(written_[index]);
    ZINF_ASSIGN_OR_RETURN(
        void* p, residency_.acquire(static_cast<tier::PartitionId>(index), tier::Tier::kDevice));
    return static_cast<const void*>(p);
}

Status TieredPartitionStorage::end_read(std::size_t index, StreamId stream) {
    // The gather reading the slice is queued on `stream`: the slice may move only after it.
    Status s = device_.synchronize(stream);
    residency_.release(static_cast<tier::PartitionId>(index), false);
    return s;
}

Status TieredPartitionStorage::write(std::size_t index, std::size_t offset_bytes,
                                     std::span<const std::byte> bytes) {
    const auto id = static_cast<tier::PartitionId>(index);
    if (!written_[index]) {
        // First write: the whole slice, straight to the store (the manager takes it as on NVMe).
        ZINF_ASSERT_EQ(offset_bytes, 0u);
        ZINF_ASSERT_EQ(bytes.size(), slice_bytes(index));
        ZINF_ASSERT_LE(bytes.size(), staging_.size());
        std::memcpy(staging_.data(), bytes.data(), bytes.size());
        swap::SwapHandle handle;
        ZINF_TRY(
            store_.swap_out(id, std::span<const std::byte>(staging_.data(), bytes.size()), handle));
        ZINF_TRY(handle.wait());
        written_[index] = true;
        return Status::ok();
    }
    ZINF_ASSERT_LE(offset_bytes + bytes.size(), slice_bytes(index));
    // A whole slice replaces the old bytes: they are not read first.
    const bool whole = offset_bytes == 0 && bytes.size() == slice_bytes(index);
    ZINF_ASSIGN_OR_RETURN(void* p, whole ? residency_.acquire_for_overwrite(id, tier::Tier::kHost)
                                         : residency_.acquire(id, tier::Tier::kHost));
    std::memcpy(static_cast<std::byte*>(p) + offset_bytes, bytes.data(), bytes.size());
    residency_.release(id, true);
    return Status::ok();
}

Status TieredPartitionStorage::write_staged(std::size_t index, std::span<const std::byte> bytes) {
    ZINF_ASSERT_EQ(bytes.size(), slice_bytes(index));  // a whole slice (write_staged's contract)
    if (!written_[index]) return write(index, 0, bytes);
    return residency_.stage_overwrite(static_cast<tier::PartitionId>(index), bytes.data());
}

Status TieredPartitionStorage::replay_trace() {
    if (!residency_.has_trace()) return Status::ok();
    // A copy: the manager may re-record its trace while this runs.
    const auto span = residency_.trace().accesses();
    const std::vector<tier::Access> accesses(span.begin(), span.end());
    residency_.begin_iteration();
    Status status;
    for (const tier::Access& a : accesses) {
        auto p = residency_.acquire(a.id, a.tier);
        if (!p.has_value()) {
            status = p.error();
            break;
        }
        residency_.release(a.id, false);
    }
    residency_.end_iteration();
    return status;
}

Status TieredPartitionStorage::read(std::size_t index, std::size_t offset_bytes,
                                    std::span<std::byte> bytes) {
    ZINF_ASSERT(written_[index]);
    ZINF_ASSERT_LE(offset_bytes + bytes.size(), slice_bytes(index));
    const auto id = static_cast<tier::PartitionId>(index);
    ZINF_ASSIGN_OR_RETURN(void* p, residency_.acquire(id, tier::Tier::kHost));
    std::memcpy(bytes.data(), static_cast<const std::byte*>(p) + offset_bytes, bytes.size());
    residency_.release(id, false);
    return Status::ok();
}

// ---- Offload -----------------------------------------------------------------------------

// Draws the residency manager's moves as trace spans: lane 1 for moves an access waited for,
// lane 3 for prefetches (start to the moment the manager noticed completion).
class Offload::MoveTrace final : public tier::MoveObserver {
public:
    MoveTrace(TraceRecorder& recorder, std::size_t partitions)
        : recorder_(recorder), started_(partitions) {}
    void move_started(tier::PartitionId id, tier::MoveKind, bool, std::size_t) override {
        if (id < started_.size()) started_[id] = TraceRecorder::Clock::now();
    }
    void move_completed(tier::PartitionId id, tier::MoveKind kind, bool prefetch,
                        bool ok) override {
        if (id >= started_.size()) return;
        const char* name = "?";
        switch (kind) {
            case tier::MoveKind::kSwapIn:
                name = prefetch ? "prefetch: swap in" : "swap in";
                break;
            case tier::MoveKind::kSwapOut:
                name = "write back";
                break;
            case tier::MoveKind::kToDevice:
                name = prefetch ? "prefetch: to device" : "to device";
                break;
            case tier::MoveKind::kToHost:
                name = "to host";
                break;
        }
        recorder_.span(ok ? name : "failed move", prefetch ? "prefetch" : "io", started_[id],
                       TraceRecorder::Clock::now(), prefetch ? 3 : 1);
    }

private:
    TraceRecorder& recorder_;
    std::vector<TraceRecorder::Clock::time_point> started_;
};

void Offload::set_trace(TraceRecorder* recorder) {
    if (!residency_) return;
    residency_->set_observer(nullptr);
    move_trace_.reset();
    if (recorder == nullptr) return;
    move_trace_ = std::make_unique<MoveTrace>(*recorder, residency_->options().partition_capacity);
    residency_->set_observer(move_trace_.get());
}

Offload::~Offload() {
    // Users before what they use (declaration order would do; explicit for clarity).
    if (residency_) residency_->set_observer(nullptr);
    move_trace_.reset();
    optimizer_.reset();
    parameters_.reset();
    residency_.reset();
    mover_.reset();
    optimizer_store_own_.reset();
    param_store_.reset();
}

Result<std::unique_ptr<Offload>> Offload::create(const OffloadPlan& plan,
                                                 const zero::Partitioning& part,
                                                 const kernels::OptimizerKernel& kernel,
                                                 Device& device) {
    std::unique_ptr<Offload> o(new Offload());
    if (plan.parameters == Home::kHost) {
        ZINF_ASSIGN_OR_RETURN(o->parameters_,
                              HostPartitionStorage::create(part, plan.dtype, device));
    }
    if (plan.needs_io) ZINF_TRY(o->open_stores(plan, part, kernel, device));
    if (plan.parameters == Home::kNvme) ZINF_TRY(o->build_parameter_tiers(plan, part, device));
    return o;
}

Status Offload::open_stores(const OffloadPlan& plan, const zero::Partitioning& part,
                            const kernels::OptimizerKernel& kernel, Device& device) {
    const std::size_t eb = dtype_size_bytes(plan.dtype);
    ZINF_ASSIGN_OR_RETURN(io_, io::Engine::create(plan.io));
    if (plan.parameters == Home::kNvme) {
        ZINF_ASSIGN_OR_RETURN(param_store_, swap::SwapStore::create(*io_, plan.parameter_store));
        for (std::size_t i = 0; i < part.parameter_count(); ++i) {
            ZINF_TRY(param_store_->reserve(static_cast<swap::PartitionId>(i),
                                           part.slot(i).slice_numel * eb));
        }
    }
    if (plan.optimizer_states == Home::kNvme) {
        if (plan.stores_shared) {
            optimizer_store_ = param_store_.get();
        } else {
            ZINF_ASSIGN_OR_RETURN(optimizer_store_own_,
                                  swap::SwapStore::create(*io_, plan.optimizer_store));
            optimizer_store_ = optimizer_store_own_.get();
        }
        ZINF_ASSIGN_OR_RETURN(optimizer_pool_, swap::create_optimizer_pool(
                                                   plan.optimizer_stack, *io_, &device,
                                                   plan.optimizer_pool_registered_with_device));
        ZINF_ASSIGN_OR_RETURN(
            auto swappers, swap::create_optimizer_swappers(plan.optimizer_stack, *optimizer_store_,
                                                           *optimizer_pool_, kernel));
        ZINF_ASSERT_EQ(swappers.size(), std::size_t{1});
        optimizer_ = std::move(swappers.front());
        if (plan.gradients == Home::kNvme) {
            ZINF_TRY(reserve_gradient_partitions(*optimizer_store_, part, plan.dtype));
        }
    }
    if (param_store_) ZINF_TRY(param_store_->commit());
    if (optimizer_store_own_) ZINF_TRY(optimizer_store_own_->commit());
    return Status::ok();
}

Status Offload::build_parameter_tiers(const OffloadPlan& plan, const zero::Partitioning& part,
                                      Device& device) {
    const std::size_t eb = dtype_size_bytes(plan.dtype);
    // The host tier is one region of a pinned pool (NUMA-placed near the device, zeroed, locked
    // when pin_memory asks; the residency manager carves partitions out of it).
    swap::PinnedPoolOptions po;
    po.name = "offload_param host tier";
    po.buffer_count = 1;
    po.buffer_size_bytes = static_cast<std::size_t>(plan.parameter_host_tier_bytes);
    po.near_device = &device;
    po.allow_unlocked = true;  // a warning, and the host tier works unlocked
    po.lock = plan.lock_parameter_host_tier;
    ZINF_ASSIGN_OR_RETURN(host_tier_, swap::PinnedPool::create(po));
    ZINF_ASSIGN_OR_RETURN(
        mover_, tier::StoreMover::create(*param_store_, &device, host_tier_->region(), plan.mover));
    ZINF_ASSIGN_OR_RETURN(residency_,
                          tier::ResidencyManager::create(plan.residency, *mover_, &device));
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        ZINF_TRY(residency_->register_partition(static_cast<tier::PartitionId>(i),
                                                part.slot(i).slice_numel * eb, plan.dtype,
                                                tier::Tier::kNvme));
    }
    ZINF_ASSIGN_OR_RETURN(auto staging, AlignedBuffer::allocate(align_up(
                                            plan.largest_partition_numel * eb, kPageBytes)));
    auto tiered = std::make_unique<TieredPartitionStorage>(*residency_, *param_store_, device, part,
                                                           plan.dtype, std::move(staging));
    tiered_ = tiered.get();
    parameters_ = std::move(tiered);
    return Status::ok();
}

OffloadFigures Offload::figures() const {
    OffloadFigures f;
    if (io_) {
        const auto s = io_->stats();
        f.bytes_read = s.bytes_read;
        f.bytes_written = s.bytes_written;
        f.faults_injected = s.faults_injected;
    }
    if (residency_) {
        f.stall_seconds += std::chrono::duration<double>(residency_->stats().stall_time).count();
    }
    return f;
}

std::size_t Offload::pinned_bytes() const noexcept {
    return (host_tier_ ? host_tier_->total_bytes() : 0) +
           (optimizer_pool_ ? optimizer_pool_->total_bytes() : 0);
}

std::string Offload::summary() const {
    std::string s;
    if (io_) s += str_cat("\n  I/O engine: ", io_->backend_name());
    return s;
}

void Offload::set_io_discard(bool on) noexcept {
    if (io_) io_->set_discard(on);
}

std::uint64_t Offload::io_ops_discarded() const {
    return io_ ? io_->stats().ops_discarded : 0;
}

}  // namespace zinf::engine
