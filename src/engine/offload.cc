// Offload: host and NVMe homes of parameter partitions and optimizer states.
#include "src/engine/offload.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/file_system.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::engine {
namespace {

constexpr std::size_t kPageBytes = 4096;

std::string joined(const std::vector<std::string>& paths) {
    std::string s;
    for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p;
    return s;
}

// Creates missing directories (as DeepSpeed does for its swap folders), then checks that each is
// a writable directory; errors name the key.
Status check_paths(const std::vector<std::string>& paths, const std::string& key) {
    for (const auto& p : paths) {
        std::error_code ec;
        std::filesystem::create_directories(p, ec);  // failures surface in the check below
        const Status s = check_writable_directory(p);
        if (!s.is_ok()) return Status(s.code(), key + ": " + s.message());
        // Refused here, naming the key, before anything is allocated; RunDir checks again.
        auto dir = io::posix_file_system().open_directory(p, /*follow_last=*/true);
        if (!dir.has_value()) return dir.error().with_context(key);
        ZINF_TRY(io::check_trusted_directory(*dir, key));
    }
    return Status::ok();
}

}  // namespace

// ---- HostPartitionStorage ----------------------------------------------------------------

Result<std::unique_ptr<HostPartitionStorage>> HostPartitionStorage::create(
    const zero::Partitioning& part, DType dtype, Device& device) {
    if (device.kind() != DeviceKind::kCpu) {
        return Status::not_supported(
            "zero_optimization.offload_param.device: \"cpu\" is implemented for device.type "
            "\"cpu\" only in this build");
    }
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

Status HostPartitionStorage::end_read(std::size_t, StreamId) { return Status::ok(); }

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
    ZINF_ASSIGN_OR_RETURN(void* p, residency_.acquire(static_cast<tier::PartitionId>(index),
                                                      tier::Tier::kDevice));
    return static_cast<const void*>(p);
}

Status TieredPartitionStorage::end_read(std::size_t index, StreamId stream) {
    // The gather reading the slice is queued on `stream`: the slice may move only after it.
    const Status s = device_.synchronize(stream);
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
        ZINF_TRY(store_.swap_out(id, std::span<const std::byte>(staging_.data(), bytes.size()),
                                 handle));
        ZINF_TRY(handle.wait());
        written_[index] = true;
        return Status::ok();
    }
    ZINF_ASSERT_LE(offset_bytes + bytes.size(), slice_bytes(index));
    ZINF_ASSIGN_OR_RETURN(void* p, residency_.acquire(id, tier::Tier::kHost));
    std::memcpy(static_cast<std::byte*>(p) + offset_bytes, bytes.data(), bytes.size());
    residency_.release(id, true);
    return Status::ok();
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
    if (host_region_locked_) (void)::munlock(host_region_.data(), host_region_.size());
}

Result<std::unique_ptr<Offload>> Offload::create(const config::EngineConfig& config,
                                                 const zero::Partitioning& part, DType dtype,
                                                 std::size_t domain_numel,
                                                 const kernels::OptimizerKernel& kernel,
                                                 Device& device) {
    const auto& zc = config.zero;
    const auto& op = zc.offload_param;
    const auto& oo = zc.offload_optimizer;
    const bool param_nvme = op.device == config::OffloadDevice::kNvme;
    const bool opt_nvme = oo.device == config::OffloadDevice::kNvme;
    const std::size_t eb = dtype_size_bytes(dtype);
    std::unique_ptr<Offload> o(new Offload());

    // ---- checks, before anything is allocated ----
    if (op.device != config::OffloadDevice::kNone && zc.stage != 3) {
        return Status::invalid_argument(str_cat(
            "zero_optimization.offload_param.device: \"", config::offload_device_name(op.device),
            "\" needs zero_optimization.stage 3, got stage ", zc.stage));
    }
    if (param_nvme) ZINF_TRY(check_paths(op.nvme_path, "zero_optimization.offload_param.nvme_path"));
    if (opt_nvme) {
        ZINF_TRY(check_paths(oo.nvme_path, "zero_optimization.offload_optimizer.nvme_path"));
    }
    std::size_t largest_slice = 0;
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        largest_slice = std::max(largest_slice, part.slot(i).slice_numel);
    }
    std::size_t param_pinned = 0;
    std::size_t device_tier = 0;
    if (param_nvme) {
        if (op.buffer_size_numel < largest_slice) {
            return Status::invalid_argument(str_cat(
                "zero_optimization.offload_param.buffer_size: ", op.buffer_size_numel,
                " elements is smaller than the largest parameter partition (", largest_slice,
                " elements); raise it to at least that"));
        }
        if (op.buffer_count < 2) {
            return Status::invalid_argument(
                str_cat("zero_optimization.offload_param.buffer_count: ", op.buffer_count,
                        "; at least 2 buffers are needed (one in use, one arriving)"));
        }
        if (op.max_in_cpu_numel < 2 * largest_slice) {
            return Status::invalid_argument(str_cat(
                "zero_optimization.offload_param.max_in_cpu: ", op.max_in_cpu_numel,
                " elements cannot hold two of the largest parameter partitions (", largest_slice,
                " elements each)"));
        }
        param_pinned = align_up(static_cast<std::size_t>(std::min<std::uint64_t>(
                                    static_cast<std::uint64_t>(op.buffer_count) *
                                        op.buffer_size_numel,
                                    op.max_in_cpu_numel)) *
                                    eb,
                                kPageBytes);
        // Host extents are page-aligned (O_DIRECT): tiny partitions take a page each.
        const std::size_t two_pages = 2 * align_up(largest_slice * eb, kPageBytes);
        if (param_pinned < two_pages) {
            log::info("offload_param: host tier raised from ", format_bytes(param_pinned), " to ",
                      format_bytes(two_pages), " (two page-aligned partitions)");
            param_pinned = two_pages;
        }
        // The device tier holds gathered-from slices: bounded by stage3_max_live_parameters and
        // by a quarter of the device budget, at least two of the largest slices.
        const std::size_t two = 2 * align_up(largest_slice * eb, std::size_t{256});
        const std::uint64_t live = zc.stage3_max_live_parameters_numel * eb;
        device_tier = static_cast<std::size_t>(
            std::max<std::uint64_t>(two, std::min<std::uint64_t>(live, device.budget_bytes() / 4)));
        if (device_tier > device.budget_bytes() / 2) {
            return Status::invalid_argument(str_cat(
                "device.memory_budget: ", device.budget_bytes(),
                " bytes cannot hold two of the largest parameter partitions (", two,
                " bytes) in half of it; raise it"));
        }
    }
    std::size_t sub_group = 0;
    std::size_t opt_pinned = 0;
    swap::OptimizerSwapperOptions so;
    if (opt_nvme) {
        sub_group = static_cast<std::size_t>(std::min<std::uint64_t>(
            std::max<std::uint64_t>(zc.sub_group_size_numel, 16), domain_numel));
        so = swap::OptimizerSwapperOptions::from_config(
            zc, config.optimizer, domain_numel,
            static_cast<swap::PartitionId>(part.parameter_count()));
        so.sub_group_numel = sub_group;
        opt_pinned = swap::OptimizerSwapper::buffers_needed(so) *
                     align_up(static_cast<std::size_t>(
                                  swap::OptimizerSwapper::buffer_size_bytes(sub_group, so.kind)),
                              kPageBytes);
    }
    const std::uint64_t host_budget = config.device.host_memory_budget_bytes;
    if (host_budget > 0 && param_pinned + opt_pinned > host_budget) {
        return Status::invalid_argument(str_cat(
            "device.host_memory_budget: ", host_budget, " bytes is less than the pinned memory "
            "the offload config needs: ", param_pinned, " bytes for parameters (offload_param "
            "buffer_count x buffer_size) + ", opt_pinned, " bytes for optimizer sub-groups "
            "(sub_group_size ", sub_group, ")"));
    }

    // ---- parameters ----
    if (op.device == config::OffloadDevice::kCpu) {
        ZINF_ASSIGN_OR_RETURN(auto host, HostPartitionStorage::create(part, dtype, device));
        o->param_where_ = str_cat("cpu (pageable host memory, ", format_bytes(host->bytes()), ")");
        o->parameters_ = std::move(host);
    }
    if (param_nvme || opt_nvme) {
        io::EngineOptions eo;
        eo.aio = config.aio;
        ZINF_ASSIGN_OR_RETURN(o->io_, io::Engine::create(eo));
        auto sopt = [&](const std::vector<std::string>& paths, const char* name) {
            return swap::SwapStoreOptions::from_config(paths, config.swap, name);
        };
        if (param_nvme) {
            ZINF_ASSIGN_OR_RETURN(o->param_store_,
                                  swap::SwapStore::create(*o->io_, sopt(op.nvme_path, "parameters")));
            for (std::size_t i = 0; i < part.parameter_count(); ++i) {
                ZINF_TRY(o->param_store_->reserve(static_cast<swap::PartitionId>(i),
                                                  part.slot(i).slice_numel * eb));
            }
        }
        if (opt_nvme) {
            if (param_nvme && oo.nvme_path == op.nvme_path) {
                o->optimizer_store_ = o->param_store_.get();
            } else {
                ZINF_ASSIGN_OR_RETURN(o->optimizer_store_own_,
                                      swap::SwapStore::create(*o->io_, sopt(oo.nvme_path,
                                                                            "optimizer")));
                o->optimizer_store_ = o->optimizer_store_own_.get();
            }
            swap::PinnedPoolOptions po;
            po.name = "offload_optimizer";
            po.buffer_count = swap::OptimizerSwapper::buffers_needed(so);
            po.buffer_size_bytes = static_cast<std::size_t>(
                swap::OptimizerSwapper::buffer_size_bytes(sub_group, so.kind));
            po.allow_unlocked = true;
            po.near_device = &device;
            ZINF_ASSIGN_OR_RETURN(o->optimizer_pool_, swap::PinnedPool::create(po));
            const Status reg = o->optimizer_pool_->register_with(*o->io_);
            if (!reg.is_ok()) log::debug("offload: ", reg.to_string());
            if (device.kind() != DeviceKind::kCpu && oo.pin_memory) {
                // New parameters go from the pool's buffers to the GPU: pinned for the device,
                // the copies run at full speed without staging. Pageable still works.
                const Status pinned = o->optimizer_pool_->register_with_device(device);
                if (!pinned.is_ok()) log::warning("offload_optimizer: ", pinned.to_string());
            }
            ZINF_ASSIGN_OR_RETURN(o->optimizer_, swap::OptimizerSwapper::create(
                                                     *o->optimizer_store_, *o->optimizer_pool_,
                                                     kernel, so));
        }
        if (o->param_store_) ZINF_TRY(o->param_store_->commit());
        if (o->optimizer_store_own_) ZINF_TRY(o->optimizer_store_own_->commit());
        if (opt_nvme) {
            o->optimizer_where_ = str_cat(
                "nvme (", joined(oo.nvme_path), "; sub-groups of ", sub_group, " elements, ",
                so.pipeline_read ? "pipelined reads" : "serial reads", ", ",
                so.pipeline_write ? "pipelined writes" : "serial writes", "; pinned ",
                format_bytes(o->optimizer_pool_->total_bytes()), ")");
        }
    }
    if (param_nvme) {
        ZINF_ASSIGN_OR_RETURN(o->host_region_, AlignedBuffer::allocate(param_pinned));
        std::memset(o->host_region_.data(), 0, o->host_region_.size());
        if (op.pin_memory) {
            if (::mlock(o->host_region_.data(), o->host_region_.size()) == 0) {
                o->host_region_locked_ = true;
            } else {
                log::warning("offload_param: pin_memory: mlock of ", format_bytes(param_pinned),
                             " failed (RLIMIT_MEMLOCK?); the host tier works unlocked");
            }
        }
        tier::StoreMoverOptions mo;
        // pin_memory false: a pageable host tier (a GPU stages its copies through the driver).
        mo.register_with_device = op.pin_memory || device.kind() == DeviceKind::kCpu;
        ZINF_ASSIGN_OR_RETURN(
            o->mover_, tier::StoreMover::create(
                           *o->param_store_, &device,
                           std::span<std::byte>(o->host_region_.data(), o->host_region_.size()),
                           mo));
        auto ro = tier::ResidencyOptions::from_config(zc, dtype, device_tier, param_pinned);
        ro.host_budget_bytes = param_pinned;  // buffers and max_in_cpu were folded in above
        ro.partition_capacity = std::max<std::size_t>(part.parameter_count(), 1);
        ZINF_ASSIGN_OR_RETURN(o->residency_, tier::ResidencyManager::create(ro, *o->mover_, &device));
        for (std::size_t i = 0; i < part.parameter_count(); ++i) {
            ZINF_TRY(o->residency_->register_partition(static_cast<tier::PartitionId>(i),
                                                       part.slot(i).slice_numel * eb, dtype,
                                                       tier::Tier::kNvme));
        }
        ZINF_ASSIGN_OR_RETURN(auto staging,
                              AlignedBuffer::allocate(align_up(largest_slice * eb, kPageBytes)));
        auto tiered = std::make_unique<TieredPartitionStorage>(
            *o->residency_, *o->param_store_, device, part, dtype, std::move(staging));
        o->tiered_ = tiered.get();
        o->parameters_ = std::move(tiered);
        o->param_where_ = str_cat(
            "nvme (", joined(op.nvme_path), "; host tier ", format_bytes(ro.host_budget_bytes),
            op.pin_memory ? " pinned" : " pageable", ", device tier ",
            format_bytes(device_tier), ", prefetch ", format_bytes(ro.prefetch_depth_bytes()),
            " ahead, checksums ", config.swap.verify_checksums ? "on" : "off", ")");
    }
    return o;
}

OffloadFigures Offload::figures() const {
    OffloadFigures f;
    if (io_) {
        const auto s = io_->stats();
        f.bytes_read = s.bytes_read;
        f.bytes_written = s.bytes_written;
    }
    if (residency_) {
        f.stall_seconds +=
            std::chrono::duration<double>(residency_->stats().stall_time).count();
    }
    return f;
}

std::size_t Offload::pinned_bytes() const noexcept {
    return host_region_.size() + (optimizer_pool_ ? optimizer_pool_->total_bytes() : 0);
}

std::string Offload::summary() const {
    std::string s;
    if (!param_where_.empty()) s += "\n  parameter partitions: " + param_where_;
    if (!optimizer_where_.empty()) s += "\n  optimizer states: " + optimizer_where_;
    if (io_) {
        s += str_cat("\n  I/O engine: ", io_->backend_name());
    }
    return s;
}

}  // namespace zinf::engine
