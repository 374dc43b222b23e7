// DeviceParameterStore: the trivial ParameterSource and GradientSink. It owns every parameter and
// its gradient in device memory (one region each, carved per parameter), so fetch is a lookup and
// release only bookkeeping. Single-device training and the tests use it; ZeRO replaces it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/base/compute.h"
#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/model/parameter.h"

namespace zinf::model {

class DeviceParameterStore final : public ParameterSource, public GradientSink {
public:
    // Each parameter starts at a multiple of kAlignmentBytes inside its region.
    static constexpr std::size_t kAlignmentBytes = 64;

    // Allocates parameters and gradients (2 x total_numel x 4 bytes, plus alignment) on
    // `device`. `registry`, `device` and `compute` are borrowed and must outlive the store.
    // Parameters are uninitialised and gradients zero after create. Errors: kNoSpace from the
    // device budget.
    static Result<std::unique_ptr<DeviceParameterStore>> create(const ParameterRegistry& registry,
                                                                Device& device, Compute& compute);
    ~DeviceParameterStore() override;
    DeviceParameterStore(const DeviceParameterStore&) = delete;
    DeviceParameterStore& operator=(const DeviceParameterStore&) = delete;

    // Writes initial_values(info, seed, 0, ...) into every parameter, through a host staging
    // buffer of max_numel floats (allocated for the call: this is init, not the hot path).
    // Blocks until the copies on `stream` are done. Errors: the device's copy errors; kIo-like
    // allocation failure of the staging buffer.
    Status initialize(std::uint64_t seed, StreamId stream);
    // Sets every gradient to zero on `stream`.
    Status zero_gradients(StreamId stream);

    // Device memory of parameter / gradient `id`; valid for the life of the store. The optimizer
    // writes parameters through these.
    float* parameter(ParamId id) const;
    float* gradient(ParamId id) const;
    const ParameterRegistry& registry() const noexcept { return registry_; }

    // Fetches not yet released, over all parameters (0 between steps when modules pair them).
    std::size_t live_fetch_count() const noexcept { return live_fetch_count_; }
    // Fetches since create (tests check how often modules fetch).
    std::uint64_t total_fetch_count() const noexcept { return total_fetch_count_; }

    Result<const float*> fetch(ParamId id, StreamId stream) override;
    Status release(ParamId id, StreamId stream) override;
    // gradient(id) += grad, on `stream` (Compute::axpy with alpha 1, exact as an add).
    Status accumulate(ParamId id, const float* grad, StreamId stream) override;

private:
    DeviceParameterStore(const ParameterRegistry& registry, Device& device, Compute& compute,
                         DeviceBuffer parameters, DeviceBuffer gradients,
                         std::vector<std::size_t> offsets_numel);

    const ParameterRegistry& registry_;
    Device& device_;
    Compute& compute_;
    DeviceBuffer parameters_;
    DeviceBuffer gradients_;
    std::vector<std::size_t> offsets_numel_;  // start of each parameter in both regions
    std::vector<std::uint32_t> fetches_;      // live fetches per parameter
    std::size_t live_fetch_count_ = 0;
    std::uint64_t total_fetch_count_ = 0;
};

}  // namespace zinf::model
