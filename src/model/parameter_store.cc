// DeviceParameterStore: parameters and gradients in two device regions.
#include "src/model/parameter_store.h"

#include <utility>

#include "src/base/aligned.h"
#include "src/base/log.h"

namespace zinf::model {

Result<std::unique_ptr<DeviceParameterStore>> DeviceParameterStore::create(
    const ParameterRegistry& registry, Device& device, Compute& compute) {
    constexpr std::size_t kAlignNumel = kAlignmentBytes / sizeof(float);
    std::vector<std::size_t> offsets;
    offsets.reserve(registry.size());
    std::size_t total = 0;
    for (const ParameterInfo& info : registry.all()) {
        offsets.push_back(total);
        total = align_up(total + info.numel, kAlignNumel);
    }
    const std::size_t bytes = total * sizeof(float);
    ZINF_ASSIGN_OR_RETURN(DeviceBuffer parameters,
                          DeviceBuffer::allocate(device, bytes, "parameter store: parameters"));
    ZINF_ASSIGN_OR_RETURN(DeviceBuffer gradients,
                          DeviceBuffer::allocate(device, bytes, "parameter store: gradients"));
    auto store = std::unique_ptr<DeviceParameterStore>(
        new DeviceParameterStore(registry, device, compute, std::move(parameters),
                                 std::move(gradients), std::move(offsets)));
    ZINF_TRY(store->zero_gradients(0));
    ZINF_TRY(device.synchronize(0));
    return store;
}

DeviceParameterStore::DeviceParameterStore(const ParameterRegistry& registry, Device& device,
                                           Compute& compute, DeviceBuffer parameters,
                                           DeviceBuffer gradients,
                                           std::vector<std::size_t> offsets_numel)
    : registry_(registry),
      device_(device),
      compute_(compute),
      parameters_(std::move(parameters)),
      gradients_(std::move(gradients)),
      offsets_numel_(std::move(offsets_numel)),
      fetches_(registry.size(), 0) {}

DeviceParameterStore::~DeviceParameterStore() {
    // A fetch outliving the store would leave a module holding freed memory.
    ZINF_ASSERT_EQ(live_fetch_count_, 0u);
}

float* DeviceParameterStore::parameter(ParamId id) const {
    ZINF_ASSERT_LT(static_cast<std::size_t>(id), offsets_numel_.size());
    return parameters_.as<float>() + offsets_numel_[id];
}

float* DeviceParameterStore::gradient(ParamId id) const {
    ZINF_ASSERT_LT(static_cast<std::size_t>(id), offsets_numel_.size());
    return gradients_.as<float>() + offsets_numel_[id];
}

Status DeviceParameterStore::initialize(std::uint64_t seed, StreamId stream) {
    ZINF_ASSIGN_OR_RETURN(
        AlignedBuffer staging,
        AlignedBuffer::allocate(std::max<std::size_t>(1, registry_.max_numel()) * sizeof(float)));
    for (const ParameterInfo& info : registry_.all()) {
        std::span<float> values(staging.as<float>(), info.numel);
        initial_values(info, seed, 0, values);
        ZINF_TRY(device_.copy_to_device(parameter(info.id), values.data(),
                                        info.numel * sizeof(float), stream));
        // The staging buffer is reused for the next parameter.
        ZINF_TRY(device_.synchronize(stream));
    }
    return Status::ok();
}

Status DeviceParameterStore::zero_gradients(StreamId stream) {
    return device_.fill_zero(gradients_.data(), gradients_.size_bytes(), stream);
}

Result<const float*> DeviceParameterStore::fetch(ParamId id, StreamId /*stream*/) {
    ZINF_ASSERT_LT(static_cast<std::size_t>(id), fetches_.size());
    ++fetches_[id];
    ++live_fetch_count_;
    ++total_fetch_count_;
    return static_cast<const float*>(parameter(id));
}

Status DeviceParameterStore::release(ParamId id, StreamId /*stream*/) {
    ZINF_ASSERT_LT(static_cast<std::size_t>(id), fetches_.size());
    // Releasing what was not fetched is a module bug.
    ZINF_ASSERT_GT(fetches_[id], 0u);
    --fetches_[id];
    --live_fetch_count_;
    return Status::ok();
}

Status DeviceParameterStore::accumulate(ParamId id, const float* grad, StreamId stream) {
    const ParameterInfo& info = registry_.info(id);
    return compute_.axpy(1.0f, grad, gradient(id), info.numel, stream);
}

}  // namespace zinf::model
