// Parameters as the model sees them: a registry of named, shaped parameters with stable ids, the
// seeded rule that gives each element its initial value, and the two interfaces through which
// modules reach parameter and gradient memory. Modules never own parameters: they fetch each one
// before use and release it after, and hand each gradient to a sink. The trivial implementation
// (parameter_store.h) owns everything in device memory; the ZeRO parameter coordinator
// implements the same interfaces to gather partitions on fetch, free them on release, and
// reduce-scatter and offload gradients as they arrive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::model {

// Dense, 0-based, in registration order (the order modules are built, input to output).
using ParamId = std::uint32_t;

// How a parameter's elements are initialised. kUniform draws each element from
// U[-bound, bound) with Philox (see initial_values); kConstant sets every element to value.
enum class InitKind : std::uint8_t { kUniform, kConstant };
struct InitRule {
    InitKind kind = InitKind::kConstant;
    float value = 0;  // kUniform: the bound; kConstant: the value
};

struct ParameterInfo {
    ParamId id = 0;
    std::string name;                // "layers.0.weight", as PyTorch's state_dict names it
    std::vector<std::size_t> shape;  // row-major; a Linear weight is {out_features, in_features}
    std::size_t numel = 0;           // product of shape
    InitRule init;
};

// The parameters of one model. Built once at model creation; read-only afterwards.
class ParameterRegistry {
public:
    // Registers a parameter and returns its id (the next in order). Names must be unique and
    // non-empty and shapes non-empty with no zero extent (asserted: models are built from code).
    ParamId add(std::string name, std::vector<std::size_t> shape, InitRule init);

    std::size_t size() const noexcept { return params_.size(); }
    const ParameterInfo& info(ParamId id) const;
    std::span<const ParameterInfo> all() const noexcept { return params_; }
    // Sum of numel over all parameters.
    std::size_t total_numel() const noexcept { return total_numel_; }
    // Largest numel of one parameter (sizes gradient scratch).
    std::size_t max_numel() const noexcept { return max_numel_; }
    // The id of `name`, or kNotFound.
    Result<ParamId> find(std::string_view name) const;

private:
    std::vector<ParameterInfo> params_;
    std::size_t total_numel_ = 0;
    std::size_t max_numel_ = 0;
};

// The registry's parameters grouped by module: runs of consecutive ids whose names share the part
// before the last '.' ("layers.0.weight" and "layers.0.bias"). A module fetches its own
// parameters together (weight and bias) and releases them before the next module's, so these are
// the sets held gathered at once (Model::fetch_groups). Allocates the result.
std::vector<std::vector<ParamId>> groups_by_module(const ParameterRegistry& registry);

// Initial values of elements [offset, offset + out.size()) of parameter `info`, for the model
// seed `seed`. Element i of a kUniform parameter is
//   bound * (2 u - 1),  u = philox::word_to_unit_float(
//       philox::element_word(seed, (0x494E4954 << 32) | id, i))       ('INIT' in the high word)
// computed in fp32, so any range of any parameter can be produced on its own (a ZeRO rank
// initialises only its partition) and a GPU gets the same values. Host memory; allocates nothing.
void initial_values(const ParameterInfo& info, std::uint64_t seed, std::size_t offset,
                    std::span<float> out) noexcept;

// Where modules get parameters from. Thread-compatible: called by the one thread that runs the
// model's forward and backward.
class ParameterSource {
public:
    virtual ~ParameterSource() = default;
    // Makes parameter `id` (info().numel fp32 values, row-major) readable in device memory for
    // work enqueued on `stream` after this call. The pointer stays valid until release(id, ...)
    // is called as many times as fetch was. May block (a swap in, an all-gather). Errors: those
    // of the implementation (kIo, kNoSpace, kCuda, ...), with the parameter's name in the message.
    virtual Result<const float*> fetch(ParamId id, StreamId stream) = 0;
    // Ends one fetch of `id`: the memory may be reused once the work enqueued on `stream` before
    // this call has completed (the implementation orders that, e.g. with an event).
    virtual Status release(ParamId id, StreamId stream) = 0;
};

// Where modules send parameter gradients. Thread-compatible, like ParameterSource.
class GradientSink {
public:
    virtual ~GradientSink() = default;
    // Adds `grad` (numel of `id` fp32 values in device memory, produced by work enqueued on
    // `stream`) into the gradient of `id`. The module overwrites `grad`'s memory with work it
    // enqueues on `stream` after this call returns, so the sink must consume it on `stream`
    // (or make `stream` wait for its own consumption on another stream) before returning.
    virtual Status accumulate(ParamId id, const float* grad, StreamId stream) = 0;
};

}  // namespace zinf::model
