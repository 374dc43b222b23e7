// The three state stores (device memory, host memory, NVMe) and OptimizerIo.
#include "src/engine/state_store.h"

#include <algorithm>
#include <cstring>

#include "kernels/state_codec.h"
#include "src/base/log.h"

namespace zinf::engine {
namespace {

// The states in one flat array each, in host-addressable memory: what the device and host
// stores share. They differ only in where the arrays come from. The master is fp32; each moment is
// stored as plan.state_dtype says, laid out as src/base/state_dtype.h describes (elements, then
// the int8 scales).
class InMemoryStateStore : public StateStore {
public:
    Status initialize(swap::ParamSource& initial) override {
        for (std::size_t k = 0; k < chunk_count(); ++k) {
            const std::size_t at = k * chunk_numel();
            ZINF_TRY(initial.fill(k, at, std::span<float>(master() + at, chunk_length(k))));
        }
        return Status::ok();
    }

    Status step(const kernels::OptimizerParams& params, swap::GradientSource& io) override {
        ZINF_ASSERT(StateLayout::of(params).arrays() == layout().arrays());
        for (std::size_t k = 0; k < chunk_count(); ++k) {
            const std::size_t at = k * chunk_numel();
            const std::size_t n = chunk_length(k);
            const kernels::StoredState state = chunk_state(at, n);
            ZINF_ASSIGN_OR_RETURN(const kernels::GradView g, io.gradients(k, at, n));
            ZINF_TRY(kernels::step_segments(kernel_, params, state, at, segments_, g,
                                            io.param_copy(k, at, n)));
            ZINF_TRY(io.updated(k, at, state.params));
        }
        return Status::ok();
    }

    Status read_chunk(std::size_t k, const StateChunk& out) override {
        check_chunk(k, out);
        const std::size_t at = k * chunk_numel();
        const kernels::StoredState state = chunk_state(at, chunk_length(k));
        if (!out.master.empty())
            std::memcpy(out.master.data(), state.params.data(), out.master.size_bytes());
        for (std::size_t i = 0; i < layout().moment_count; ++i) {
            if (out.moments[i].empty()) continue;
            kernels::decode_moment(dtype_, layout().moment(i).non_negative, state.moments[i],
                                   state.scales[i], out.moments[i]);
        }
        return Status::ok();
    }

    Status write_chunk(std::size_t k, const ConstStateChunk& in) override {
        check_chunk(k, in);
        const std::size_t at = k * chunk_numel();
        const kernels::StoredState state = chunk_state(at, chunk_length(k));
        if (!in.master.empty())
            std::memcpy(state.params.data(), in.master.data(), in.master.size_bytes());
        for (std::size_t i = 0; i < layout().moment_count; ++i) {
            if (in.moments[i].empty()) continue;
            kernels::encode_moment(dtype_, layout().moment(i).non_negative, in.moments[i],
                                   state.moments[i], state.scales[i]);
        }
        return Status::ok();
    }

protected:
    // The master, then the kept moments.
    static constexpr std::size_t kStateArrays = 1 + kMaxMoments;

    InMemoryStateStore(const OffloadPlan& plan, const kernels::OptimizerKernel& kernel)
        : StateStore(plan.domain_numel, plan.sub_group_numel, StateLayout::of(plan.optimizer),
                     plan.state_dtype),
          kernel_(kernel),
          dtype_(plan.state_dtype),
          segments_(plan.state_segments),
          rounding_seed_(plan.rounding_seed) {}

    // Allocates (zeroed) every array the layout keeps with `allocate(buffer, bytes, what)` and
    // points the store at them.
    template <typename Buffer, typename Allocate>
    Status allocate_arrays(Buffer (&arrays)[kStateArrays], const OffloadPlan& plan,
                           const char* where, Allocate allocate) {
        for (std::size_t i = 0; i < layout().arrays(); ++i) {
            const std::string_view name =
                i == 0 ? std::string_view("fp32 master parameters") : layout().moment(i - 1).name;
            ZINF_TRY(
                allocate(arrays[i], in_memory_state_bytes(plan, i), str_cat(where, " ", name)));
            data_[i] = arrays[i].template as<std::byte>();
        }
        return Status::ok();
    }

private:
    float* master() const noexcept { return reinterpret_cast<float*>(data_[0]); }

    // Elements [at, at + n) of every array, as the kernel takes them.
    kernels::StoredState chunk_state(std::size_t at, std::size_t n) const noexcept {
        kernels::StoredState s;
        s.params = std::span<float>(master() + at, n);
        s.dtype = dtype_;
        s.rounding_seed = rounding_seed_;
        const std::size_t eb = state_element_size_bytes(dtype_);
        for (std::size_t i = 0; i < layout().moment_count; ++i) {
            s.moments[i] = std::span<std::byte>(data_[i + 1] + at * eb, n * eb);
            if (dtype_ == StateDType::kInt8) {
                ZINF_ASSERT(at % kStateBlockNumel == 0);
                auto* scales = reinterpret_cast<float*>(data_[i + 1] +
                                                        state_scales_offset_bytes(dtype_, numel()));
                s.scales[i] =
                    std::span<float>(scales + at / kStateBlockNumel, state_scale_count(dtype_, n));
            }
        }
        return s;
    }

    const kernels::OptimizerKernel& kernel_;
    StateDType dtype_;
    std::vector<kernels::StateSegment> segments_;
    std::uint64_t rounding_seed_;
    std::byte* data_[kStateArrays] = {};  // the master, then the kept moments
};

// offload_optimizer "none": the states in device memory, counted against the device budget. The
// CPU optimizer reads them in place, so the device's memory must be host memory (the CPU device;
// config::load refuses "none" on a GPU).
class DeviceStateStore final : public InMemoryStateStore {
public:
    static Result<std::unique_ptr<StateStore>> create(const OffloadPlan& plan, Device& device,
                                                      const kernels::OptimizerKernel& kernel) {
        ZINF_ASSERT(device.kind() == DeviceKind::kCpu);
        std::unique_ptr<DeviceStateStore> s(new DeviceStateStore(plan, kernel));
        ZINF_TRY(s->allocate_arrays(
            s->arrays_, plan, "device",
            [&](DeviceBuffer& b, std::size_t bytes, const std::string& what) {
                ZINF_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(device, bytes, what.c_str()));
                return device.fill_zero(b.data(), bytes, 0);
            }));
        ZINF_TRY(device.synchronize(0));
        return std::unique_ptr<StateStore>(std::move(s));
    }
    Home home() const noexcept override { return Home::kDevice; }

private:
    DeviceStateStore(const OffloadPlan& plan, const kernels::OptimizerKernel& kernel)
        : InMemoryStateStore(plan, kernel) {}
    DeviceBuffer arrays_[kStateArrays];
};

// offload_optimizer "cpu": the states in host memory outside the device budget.
class HostStateStore final : public InMemoryStateStore {
public:
    static Result<std::unique_ptr<StateStore>> create(const OffloadPlan& plan,
                                                      const kernels::OptimizerKernel& kernel) {
        std::unique_ptr<HostStateStore> s(new HostStateStore(plan, kernel));
        ZINF_TRY(s->allocate_arrays(
            s->arrays_, plan, "host",
            [](AlignedBuffer& b, std::size_t bytes, const std::string& what) {
                auto r = AlignedBuffer::allocate(bytes, kDefaultAlignmentBytes, /*zero_fill=*/true);
                if (!r.has_value()) return r.error().with_context(what);
                b = std::move(*r);
                return Status::ok();
            }));
        return std::unique_ptr<StateStore>(std::move(s));
    }
    Home home() const noexcept override { return Home::kHost; }

private:
    HostStateStore(const OffloadPlan& plan, const kernels::OptimizerKernel& kernel)
        : InMemoryStateStore(plan, kernel) {}
    AlignedBuffer arrays_[kStateArrays];
};

// offload_optimizer "nvme": the states in the swap store, each chunk one sub-group of the
// swapper (read i+1, update i, write i-1).
class NvmeStateStore final : public StateStore {
public:
    NvmeStateStore(const OffloadPlan& plan, swap::OptimizerSwapper& swapper)
        : StateStore(plan.domain_numel, plan.sub_group_numel, StateLayout::of(plan.optimizer),
                     plan.state_dtype),
          swapper_(swapper),
          store_(swapper.store()) {
        ZINF_ASSERT_EQ(swapper.options().sub_group_numel, plan.sub_group_numel);
        ZINF_ASSERT_EQ(swapper.sub_group_count(), chunk_count());
    }
    Home home() const noexcept override { return Home::kNvme; }

    Status initialize(swap::ParamSource& initial) override {
        return swapper_.initialize(initial).with_context(
            "offload_optimizer nvme: writing initial states");
    }
    Status step(const kernels::OptimizerParams& params, swap::GradientSource& io) override {
        Status s = swapper_.step(params, io);
        read_wait_seconds_ = swapper_.last_step_stats().read_wait_seconds;
        return s;
    }
    Status read_chunk(std::size_t k, const StateChunk& out) override {
        check_chunk(k, out);
        return swapper_.read_sub_group(
            k, out.master,
            std::span<const std::span<float>>(out.moments.data(), layout().moment_count));
    }
    Status write_chunk(std::size_t k, const ConstStateChunk& in) override {
        check_chunk(k, in);
        return swapper_.write_sub_group(
            k, in.master,
            std::span<const std::span<const float>>(in.moments.data(), layout().moment_count));
    }
    Status io_only_pass() override { return swapper_.io_only_pass(); }
    double last_read_wait_seconds() const noexcept override { return read_wait_seconds_; }
    bool snapshots() const noexcept override { return store_.copy_on_write(); }
    Status pin_snapshot() override {
        if (!snapshots()) return StateStore::pin_snapshot();
        return swapper_.pin_states();
    }
    Status read_snapshot_chunk(std::size_t k, const StateChunk& out,
                               AlignedBuffer& scratch) const override {
        check_chunk(k, out);
        return swapper_.read_pinned_sub_group(
            k, out.master,
            std::span<const std::span<float>>(out.moments.data(), layout().moment_count), scratch);
    }
    void release_snapshot_chunk(std::size_t k) override { swapper_.unpin_sub_group(k); }
    double snapshot_wait_seconds() const noexcept override {
        return static_cast<double>(store_.stats().pin_wait_ns) * 1e-9;
    }

private:
    swap::OptimizerSwapper& swapper_;
    const swap::SwapStore& store_;
    double read_wait_seconds_ = 0.0;
};

}  // namespace

StateLayout StateLayout::of(const kernels::OptimizerParams& params) noexcept {
    StateLayout l;
    l.optimizer = &optimizer_descriptor(params.kind);
    l.moment_count = l.optimizer->kept_moment_count(params.amsgrad);
    return l;
}

const MomentDescriptor& StateLayout::moment(std::size_t i) const noexcept {
    ZINF_ASSERT_LT(i, moment_count);
    // The kept moments are the descriptor's first ones: amsgrad-only moments come last.
    return optimizer->moments[i];
}

ConstStateChunk as_const(const StateChunk& c) noexcept {
    ConstStateChunk out;
    out.master = c.master;
    for (std::size_t i = 0; i < kMaxMoments; ++i) out.moments[i] = c.moments[i];
    return out;
}

std::size_t StateStore::chunk_length(std::size_t k) const noexcept {
    const std::size_t at = k * chunk_numel_;
    return at >= numel_ ? 0 : std::min(chunk_numel_, numel_ - at);
}

std::uint64_t StateStore::state_bytes() const noexcept {
    return numel_ * sizeof(float) +
           layout_.moment_count * state_moment_stored_bytes(dtype_, numel_);
}

std::uint64_t in_memory_state_bytes(const OffloadPlan& plan, std::size_t i) noexcept {
    const std::uint64_t bytes =
        i == 0 ? static_cast<std::uint64_t>(plan.domain_numel) * sizeof(float)
               : state_moment_stored_bytes(plan.state_dtype, plan.domain_numel);
    return std::max<std::uint64_t>(bytes, 64);
}

template <typename Chunk>
void StateStore::check_chunk(std::size_t k, const Chunk& c) const {
    ZINF_ASSERT_LT(k, chunk_count());
    const std::size_t n = chunk_length(k);
    ZINF_ASSERT_EQ(c.master.size(), n);
    for (std::size_t i = 0; i < kMaxMoments; ++i) {
        ZINF_ASSERT_EQ(c.moments[i].size(), i < layout_.moment_count ? n : 0);
    }
}

Result<std::unique_ptr<StateStore>> make_state_store(const OffloadPlan& plan, Device& device,
                                                     const kernels::OptimizerKernel& kernel,
                                                     swap::OptimizerSwapper* swapper) {
    switch (plan.optimizer_states) {
        case Home::kDevice:
            return DeviceStateStore::create(plan, device, kernel);
        case Home::kHost:
            return HostStateStore::create(plan, kernel);
        case Home::kNvme:
            ZINF_ASSERT(swapper != nullptr);
            return std::unique_ptr<StateStore>(new NvmeStateStore(plan, *swapper));
    }
    return Status::internal("make_state_store: unknown home");
}

// ---- OptimizerIo ---------------------------------------------------------------------------

OptimizerIo::OptimizerIo(const OffloadPlan& plan, zero::ParameterCoordinator& coordinator,
                         Device& device)
    : coordinator_(coordinator),
      device_(device),
      dtype_(plan.dtype),
      update_(plan.parameter_update),
      copy_gradients_(plan.gradients_copied_to_host),
      master_persists_(plan.optimizer_states != Home::kNvme) {}

Result<std::unique_ptr<OptimizerIo>> OptimizerIo::create(const OffloadPlan& plan,
                                                         zero::ParameterCoordinator& coordinator,
                                                         Device& device, GradientSwap* streamed) {
    std::unique_ptr<OptimizerIo> io(new OptimizerIo(plan, coordinator, device));
    io->streamed_ = streamed;
    const std::size_t eb = dtype_size_bytes(plan.dtype);
    if (plan.gradients_copied_to_host) {
        auto b = AlignedBuffer::allocate(std::max<std::size_t>(plan.domain_numel * eb, 64),
                                         kDefaultAlignmentBytes, /*zero_fill=*/true);
        if (!b.has_value()) return b.error().with_context("host copy of the gradients");
        io->host_grads_ = std::move(*b);
    }
    if (plan.parameter_update == ParameterUpdate::kThroughCoordinator &&
        plan.dtype != DType::kFloat32) {
        auto b = AlignedBuffer::allocate(std::max<std::size_t>(plan.sub_group_numel * eb, 64));
        if (!b.has_value()) return b.error().with_context("host 16-bit parameters");
        io->staging_ = std::move(*b);
    }
    return io;
}

Result<const std::byte*> OptimizerIo::prepare(StreamId stream) {
    const auto& d = coordinator_.domain();
    grads_ = static_cast<const std::byte*>(d.gradients);
    if (copy_gradients_) {
        ZINF_TRY(device_.copy_to_host(host_grads_.data(), d.gradients,
                                      d.numel * dtype_size_bytes(d.dtype), stream));
        ZINF_TRY(device_.synchronize(stream));
        grads_ = host_grads_.data();
    }
    return grads_;
}

Result<kernels::GradView> OptimizerIo::gradients(std::size_t, std::uint64_t offset_numel,
                                                 std::uint64_t numel) {
    if (streamed_ != nullptr) {
        ZINF_ASSIGN_OR_RETURN(const std::span<const std::byte> g,
                              streamed_->gradients(offset_numel, numel));
        return kernels::GradView{g.data(), static_cast<std::size_t>(numel), dtype_};
    }
    ZINF_ASSERT(grads_ != nullptr);  // prepare() came first
    return kernels::GradView{grads_ + offset_numel * dtype_size_bytes(dtype_),
                             static_cast<std::size_t>(numel), dtype_};
}

kernels::ParamCopy OptimizerIo::param_copy(std::size_t, std::uint64_t offset_numel,
                                           std::uint64_t numel) {
    if (dtype_ == DType::kFloat32) return kernels::ParamCopy::none();
    const auto n = static_cast<std::size_t>(numel);
    switch (update_) {
        case ParameterUpdate::kInPlace: {
            auto* params = static_cast<std::byte*>(coordinator_.domain().parameters);
            return kernels::ParamCopy{
                reinterpret_cast<std::uint16_t*>(params + offset_numel * dtype_size_bytes(dtype_)),
                n, dtype_};
        }
        case ParameterUpdate::kThroughCoordinator:
            return kernels::ParamCopy{staging_.as<std::uint16_t>(), n, dtype_};
        case ParameterUpdate::kCopyMaster:
            break;
    }
    return kernels::ParamCopy::none();
}

Status OptimizerIo::updated(std::size_t, std::uint64_t offset_numel,
                            std::span<const float> params) {
    switch (update_) {
        case ParameterUpdate::kInPlace:
            return Status::ok();  // the kernel wrote them
        case ParameterUpdate::kCopyMaster: {
            auto* device_params = static_cast<std::byte*>(coordinator_.domain().parameters);
            ZINF_TRY(device_.copy_to_device(device_params + offset_numel * sizeof(float),
                                            params.data(), params.size_bytes(), 0));
            // The NVMe store's chunk buffer is reused (read into, written out) as soon as this
            // returns: the copy must have read it. A master in memory stays put until the
            // engine's synchronize at the end of the step, so that copy may overlap the next
            // chunk's kernel.
            return master_persists_ ? Status::ok() : device_.synchronize(0);
        }
        case ParameterUpdate::kThroughCoordinator: {
            // Blocks until copied: the staging buffer is reused by the next chunk.
            const std::span<const std::byte> bytes =
                dtype_ == DType::kFloat32
                    ? std::as_bytes(params)
                    : std::span<const std::byte>(staging_.data(),
                                                 params.size() * dtype_size_bytes(dtype_));
            return coordinator_.write_domain_parameters(offset_numel, bytes, 0);
        }
    }
    return Status::ok();
}

Status OptimizerIo::store_parameters(std::uint64_t offset_numel, std::span<const std::byte> bytes,
                                     StreamId stream, bool staged) {
    if (update_ == ParameterUpdate::kThroughCoordinator) {
        return coordinator_.write_domain_parameters(offset_numel, bytes, stream, staged);
    }
    auto* params = static_cast<std::byte*>(coordinator_.domain().parameters);
    ZINF_ASSERT(params != nullptr);
    ZINF_TRY(device_.copy_to_device(params + offset_numel * dtype_size_bytes(dtype_), bytes.data(),
                                    bytes.size(), stream));
    return device_.synchronize(stream);
}

}  // namespace zinf::engine
