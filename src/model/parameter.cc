// ParameterRegistry and the seeded initial values of parameters.
#include "src/model/parameter.h"

#include <algorithm>
#include <utility>

#include "src/base/log.h"
#include "src/base/philox.h"

namespace zinf::model {

namespace {
constexpr std::uint64_t kInitStreamTag = 0x494E4954ull;  // 'INIT'
}  // namespace

ParamId ParameterRegistry::add(std::string name, std::vector<std::size_t> shape, InitRule init) {
    ZINF_ASSERT(!name.empty());
    ZINF_ASSERT(!shape.empty());
    ZINF_ASSERT_MSG(!find(name).has_value(), str_cat("duplicate parameter name ", name));
    std::size_t numel = 1;
    for (const std::size_t extent : shape) {
        ZINF_ASSERT_GT(extent, 0u);
        numel *= extent;
    }
    ParameterInfo info;
    info.id = static_cast<ParamId>(params_.size());
    info.name = std::move(name);
    info.shape = std::move(shape);
    info.numel = numel;
    info.init = init;
    params_.push_back(std::move(info));
    total_numel_ += numel;
    max_numel_ = std::max(max_numel_, numel);
    return params_.back().id;
}

const ParameterInfo& ParameterRegistry::info(ParamId id) const {
    ZINF_ASSERT_LT(static_cast<std::size_t>(id), params_.size());
    return params_[id];
}

Result<ParamId> ParameterRegistry::find(std::string_view name) const {
    for (const ParameterInfo& info : params_) {
        if (info.name == name) return info.id;
    }
    return Status::not_found(str_cat("no parameter named '", name, "'"));
}

void initial_values(const ParameterInfo& info, std::uint64_t seed, std::size_t offset,
                    std::span<float> out) noexcept {
    ZINF_ASSERT_LE(offset, info.numel);
    ZINF_ASSERT_LE(out.size(), info.numel - offset);
    if (info.init.kind == InitKind::kConstant) {
        for (float& value : out) value = info.init.value;
        return;
    }
    const float bound = info.init.value;
    const std::uint64_t stream = (kInitStreamTag << 32) | info.id;
    for (std::size_t i = 0; i < out.size(); ++i) {
        const float u = philox::word_to_unit_float(philox::element_word(seed, stream, offset + i));
        out[i] = bound * (2.0f * u - 1.0f);
    }
}

std::vector<std::vector<ParamId>> groups_by_module(const ParameterRegistry& registry) {
    std::vector<std::vector<ParamId>> groups;
    std::string_view module_prev;
    for (const ParameterInfo& info : registry.all()) {
        const std::string_view name = info.name;
        const std::size_t dot = name.rfind('.');
        const std::string_view module = dot == std::string_view::npos ? name : name.substr(0, dot);
        if (groups.empty() || module != module_prev) groups.emplace_back();
        groups.back().push_back(info.id);
        module_prev = module;
    }
    return groups;
}

}  // namespace zinf::model
