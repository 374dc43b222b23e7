// Module: one layer with a forward and a backward over a batch of rows, and the Context a step
// passes to it. Modules hold no parameters (they fetch them from a ParameterSource around each
// use and hand gradients to a GradientSink) and allocate nothing after creation: whatever they
// save for backward (LayerNorm statistics, dropout masks) is sized at creation for rows_max.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "src/base/compute.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/model/parameter.h"

namespace zinf::model {

// What one forward or backward call needs. Borrowed for the call.
struct Context {
    Compute& compute;
    ParameterSource& params;
    GradientSink& grads;
    StreamId stream = 0;
    // The training step: dropout's Philox counter, so that each step draws a fresh mask and a
    // replayed step draws the same one.
    std::uint64_t step = 0;
    // Off: dropout is the identity and backward is not allowed.
    bool training = true;
    // Device scratch for parameter gradients (at least the largest parameter's numel in every
    // backward that produces one); owned by the model. A module writes a gradient here and hands
    // it to grads.accumulate before writing the next one.
    float* grad_scratch = nullptr;
    std::size_t grad_scratch_numel = 0;
};

class Module {
public:
    virtual ~Module() = default;

    // "linear", "relu", ...
    virtual std::string_view kind() const noexcept = 0;
    virtual std::size_t in_features() const noexcept = 0;
    virtual std::size_t out_features() const noexcept = 0;
    // Parameters this module fetches, in the order it fetches them; empty for activations.
    virtual std::span<const ParamId> parameter_ids() const noexcept { return {}; }

    // y (rows x out_features) from x (rows x in_features), device memory owned by the caller,
    // rows in [1, rows_max]. The module keeps x and y (pointers only) for backward: the caller
    // leaves both unchanged until backward has run. Errors: those of fetch, release and Compute.
    virtual Status forward(const Context& ctx, const float* x, float* y, std::size_t rows) = 0;
    // Given dy (rows x out_features, as in the last forward), writes dx (rows x in_features;
    // null when the caller needs no input gradient, e.g. for the first layer) and accumulates
    // parameter gradients into ctx.grads. dx may equal dy when in and out features are equal
    // and the module says so in its comment. Precondition: a training forward came first.
    virtual Status backward(const Context& ctx, const float* dy, float* dx) = 0;
};

}  // namespace zinf::model
