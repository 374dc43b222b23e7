// ExternalModel: a model whose forward and backward run outside the engine (the PyTorch front
// end: a torch module drives them), known to the engine only by its parameters. The engine
// places, partitions, offloads and steps those parameters as it does a built-in model's; the
// driver brackets each pass with Engine::begin_forward / end_forward / begin_backward /
// end_backward and reaches parameters and gradients through Engine::parameter_source() and
// Engine::gradient_sink(). The initial values are the driver's (the torch module's weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/model/model.h"

namespace zinf::model {

class ExternalModel final : public Model {
public:
    // Writes the initial values of elements [offset, offset + out.size()) of parameter `info`.
    // Called during Engine::create only, from the thread that creates the engine.
    using InitialValues =
        std::function<void(const ParameterInfo& info, std::size_t offset, std::span<float> out)>;
    struct ParameterSpec {
        std::string name;
        std::vector<std::size_t> shape;
    };

    // Errors: kInvalidArgument for no parameters, an empty or repeated name, or a shape with a
    // zero extent (naming the parameter).
    static Result<std::unique_ptr<ExternalModel>> create(std::string name,
                                                         std::vector<ParameterSpec> parameters,
                                                         InitialValues initial,
                                                         std::size_t batch_rows_max);

    std::string_view name() const noexcept override { return name_; }
    const ParameterRegistry& parameters() const noexcept override { return registry_; }
    BatchShape batch_shape() const noexcept override {
        return BatchShape{InputKind::kFloat32, 1, 1, 1};
    }
    std::size_t batch_rows_max() const noexcept override { return batch_rows_max_; }
    std::size_t workspace_bytes() const noexcept override { return 0; }
    // Unknown: the driving program (a torch module's hooks) decides what it holds gathered at
    // once, so the planner's figure for stage 3's gathered copies is a lower bound.
    std::vector<std::vector<ParamId>> fetch_groups() const override { return {}; }
    void initial_values(const ParameterInfo& info, std::uint64_t seed, std::size_t offset,
                        std::span<float> out) const override;

    // The engine's batch calls (Engine::forward, backward, evaluate, ...) are for models it
    // drives itself: kNotSupported, naming the calls to use instead.
    Status forward(const Context& ctx, const void* inputs, const std::int32_t* labels,
                   std::size_t rows) override;
    Status backward(const Context& ctx, float grad_scale) override;
    Result<float> read_loss(StreamId stream) const override;
    Status count_correct(const Context& ctx, std::uint64_t* correct_count,
                         bool accumulate) const override;
    Status read_predictions(StreamId stream, std::span<std::int32_t> out) const override;

private:
    ExternalModel() = default;
    Status driven_elsewhere() const;

    std::string name_;
    ParameterRegistry registry_;
    InitialValues initial_;
    std::size_t batch_rows_max_ = 1;
};

}  // namespace zinf::model
