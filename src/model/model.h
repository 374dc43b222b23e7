// Model: what the Engine trains. A model is built from modules (module.h) and owns their
// workspace; it names its parameters in a ParameterRegistry, fetches them through the
// Context's ParameterSource around each use and hands gradients to its GradientSink, so the
// engine can place, partition and offload every parameter without knowing the architecture.
// Mlp is one model; src/engine's model registry builds the one `model.type` names, and an
// embedding program (or a test) may pass any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/base/device.h"
#include "src/base/log.h"
#include "src/base/status.h"
#include "src/model/module.h"
#include "src/model/parameter.h"

namespace zinf::model {

// The element type of a model's inputs.
enum class InputKind : std::uint8_t {
    kFloat32,  // features (images, vectors)
    kInt32,    // token ids
};

// One row of a batch: input_numel inputs of input_kind, and label_numel int32 labels in
// [0, classes) (one per row for a classifier, one per position for a language model).
struct BatchShape {
    InputKind input_kind = InputKind::kFloat32;
    std::size_t input_numel = 0;
    std::size_t label_numel = 1;
    std::size_t classes = 0;
};

class Model {
public:
    virtual ~Model() = default;

    virtual std::string_view name() const noexcept = 0;
    virtual const ParameterRegistry& parameters() const noexcept = 0;
    virtual BatchShape batch_shape() const noexcept = 0;
    // The most rows a forward takes (its workspace was sized for them at creation).
    virtual std::size_t batch_rows_max() const noexcept = 0;
    // Device bytes the model holds besides its parameters (activations, gradients, scratch).
    virtual std::size_t workspace_bytes() const noexcept = 0;
    // The sets of parameters a forward or backward holds fetched at once (the planner bounds
    // stage 3's gathered working set with the largest). By default a module's parameters
    // (groups_by_module); a model that holds more at once says so. Allocates the result.
    virtual std::vector<std::vector<ParamId>> fetch_groups() const {
        return groups_by_module(parameters());
    }

    // Runs the model over `inputs` (rows x input_numel of input_kind, device memory, rows in
    // [1, batch_rows_max()]). With labels (rows x label_numel, device memory) it also computes
    // the mean loss (read_loss). Inputs and labels stay borrowed until backward. Errors: those
    // of fetch, release and Compute, with the failing module named.
    virtual Status forward(const Context& ctx, const void* inputs, const std::int32_t* labels,
                           std::size_t rows) = 0;
    // Accumulates d(loss * grad_scale)/d(parameter) into ctx.grads for the last forward, which
    // must have been a training forward with labels.
    virtual Status backward(const Context& ctx, float grad_scale) = 0;
    // Copies the last loss to the host; blocks until `stream` has produced it.
    virtual Result<float> read_loss(StreamId stream) const = 0;
    // Adds the number of labels of the last forward that its prediction (the argmax) matches to
    // *correct_count (device memory), or writes it when !accumulate.
    virtual Status count_correct(const Context& ctx, std::uint64_t* correct_count,
                                 bool accumulate) const = 0;
    // The predictions (argmax) of the last forward, rows x label_numel of them, copied to the
    // host. Blocks. Not on the hot path: may allocate.
    virtual Status read_predictions(StreamId stream, std::span<std::int32_t> out) const = 0;
    // The logits of the last forward (rows x label_numel x classes), copied to the host, for
    // sampling from a language model. Blocks. kNotSupported for a model that does not say.
    virtual Status read_logits(StreamId /*stream*/, std::span<float> /*out*/) const {
        return Status::not_supported(str_cat(name(), ": reading the logits is not supported"));
    }
    // Initial values of elements [offset, offset + out.size()) of parameter `info` (host
    // memory), for the engine's seed. Models built from code draw them by their InitRule
    // (model::initial_values); a model whose weights come from elsewhere (ExternalModel: a torch
    // module's) copies them.
    virtual void initial_values(const ParameterInfo& info, std::uint64_t seed, std::size_t offset,
                                std::span<float> out) const {
        model::initial_values(info, seed, offset, out);
    }
    // io::Engine::set_discard on the I/O the model does itself (kept activations on NVMe), for
    // Engine::set_io_discard. A model without I/O of its own has nothing to do.
    virtual void set_io_discard(bool /*on*/) noexcept {}
};

}  // namespace zinf::model
