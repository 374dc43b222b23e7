// ExternalModel: the parameters of a model driven from outside the engine.
#include "src/model/external_model.h"

#include <algorithm>
#include <set>
#include <utility>

#include "src/base/log.h"

namespace zinf::model {

Result<std::unique_ptr<ExternalModel>> ExternalModel::create(std::string name,
                                                             std::vector<ParameterSpec> parameters,
                                                             InitialValues initial,
                                                             std::size_t batch_rows_max) {
    if (parameters.empty()) {
        return Status::invalid_argument(name + ": the model has no parameters to train");
    }
    std::set<std::string> seen;
    for (const auto& p : parameters) {
        if (p.name.empty()) return Status::invalid_argument(name + ": a parameter without a name");
        if (!seen.insert(p.name).second) {
            return Status::invalid_argument(str_cat(name, ": parameter ", p.name, " given twice"));
        }
        const bool zero_extent = std::find(p.shape.begin(), p.shape.end(), 0u) != p.shape.end();
        if (zero_extent) {
            return Status::invalid_argument(
                str_cat(name, ": parameter ", p.name, " has no elements (a zero extent)"));
        }
    }
    std::unique_ptr<ExternalModel> m(new ExternalModel());
    m->name_ = std::move(name);
    m->initial_ = std::move(initial);
    m->batch_rows_max_ = std::max<std::size_t>(batch_rows_max, 1);
    for (auto& p : parameters) {
        // A 0-d tensor (a scalar parameter) is one element.
        if (p.shape.empty()) p.shape.push_back(1);
        m->registry_.add(std::move(p.name), std::move(p.shape), InitRule{});
    }
    return m;
}

void ExternalModel::initial_values(const ParameterInfo& info, std::uint64_t /*seed*/,
                                   std::size_t offset, std::span<float> out) const {
    if (initial_) {
        initial_(info, offset, out);
    } else {
        std::fill(out.begin(), out.end(), 0.0f);
    }
}

Status ExternalModel::driven_elsewhere() const {
    return Status::not_supported(
        str_cat(name_,
                ": an external model runs its own forward and backward (Engine::begin_forward, "
                "end_forward, begin_backward, end_backward); the engine's batch calls do not "
                "apply"));
}

Status ExternalModel::forward(const Context&, const void*, const std::int32_t*, std::size_t) {
    return driven_elsewhere();
}
Status ExternalModel::backward(const Context&, float) {
    return driven_elsewhere();
}
Result<float> ExternalModel::read_loss(StreamId) const {
    return driven_elsewhere();
}
Status ExternalModel::count_correct(const Context&, std::uint64_t*, bool) const {
    return driven_elsewhere();
}
Status ExternalModel::read_predictions(StreamId, std::span<std::int32_t>) const {
    return driven_elsewhere();
}

}  // namespace zinf::model
