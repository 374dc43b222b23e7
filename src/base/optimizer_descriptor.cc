// The registry of optimizer descriptors: the four built-ins, then whatever registers.
#include "src/base/optimizer_descriptor.h"

#include <atomic>
#include <cctype>
#include <mutex>

#include "src/base/assert.h"
#include "src/base/log.h"

namespace zinf {
namespace {

constexpr MomentDescriptor kExpAvg{"exp_avg", "exp_avg", false, false};
constexpr MomentDescriptor kExpAvgSq{"exp_avg_sq", "exp_avg_sq", true, false};
constexpr MomentDescriptor kMaxExpAvgSq{"max_exp_avg_sq", "max_exp_avg_sq", true, true};

OptimizerDescriptor adam_like(OptimizerKind kind, std::string_view name, std::string_view display) {
    OptimizerDescriptor d;
    d.kind = kind;
    d.name = name;
    d.display_name = display;
    d.moments = {kExpAvg, kExpAvgSq, kMaxExpAvgSq};
    d.moment_count = 3;
    d.uses_betas = true;
    d.uses_eps = true;
    d.has_bias_correction = true;
    d.has_amsgrad = true;
    d.has_torch_rounding = true;
    return d;
}

OptimizerDescriptor adagrad() {
    OptimizerDescriptor d;
    d.kind = OptimizerKind::kAdagrad;
    d.name = "adagrad";
    d.display_name = "Adagrad";
    // DeepSpeed's CPU Adagrad calls the running sum exp_avg_sq; torch calls it sum.
    d.moments = {MomentDescriptor{"exp_avg_sq", "sum", true, false}};
    d.moment_count = 1;
    d.uses_eps = true;
    return d;
}

OptimizerDescriptor lion() {
    OptimizerDescriptor d;
    d.kind = OptimizerKind::kLion;
    d.name = "lion";
    d.display_name = "Lion";
    d.moments = {kExpAvg};
    d.moment_count = 1;
    d.uses_betas = true;
    d.default_beta2 = 0.99;  // the paper's (and lion-pytorch's) default
    return d;
}

// Slots are written once, before their count is published (release), and never change:
// readers need no lock. Registration itself is serialised.
struct Registry {
    std::array<OptimizerDescriptor, kMaxOptimizers> slots;
    std::atomic<std::size_t> count{0};
    std::mutex mutex;
    Registry() {
        slots[0] = adam_like(OptimizerKind::kAdam, "adam", "Adam");
        slots[1] = adam_like(OptimizerKind::kAdamW, "adamw", "AdamW");
        slots[2] = adagrad();
        slots[3] = lion();
        count.store(kBuiltinOptimizerCount, std::memory_order_release);
    }
};

Registry& registry() {
    static Registry r;
    return r;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(a[i])) !=
            std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    }
    return true;
}

}  // namespace

std::size_t OptimizerDescriptor::kept_moment_count(bool amsgrad) const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < moment_count; ++i) {
        if (!moments[i].amsgrad_only || amsgrad) ++n;
    }
    return n;
}

bool optimizer_registered(OptimizerKind kind) noexcept {
    return static_cast<std::size_t>(kind) < registry().count.load(std::memory_order_acquire);
}

const OptimizerDescriptor& optimizer_descriptor(OptimizerKind kind) noexcept {
    Registry& r = registry();
    const auto index = static_cast<std::size_t>(kind);
    ZINF_ASSERT_LT(index, r.count.load(std::memory_order_acquire));
    return r.slots[index];
}

const OptimizerDescriptor* find_optimizer(std::string_view name) noexcept {
    Registry& r = registry();
    const std::size_t n = r.count.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i) {
        if (equal_ignoring_case(r.slots[i].name, name) ||
            equal_ignoring_case(r.slots[i].display_name, name))
            return &r.slots[i];
    }
    return nullptr;
}

std::vector<const OptimizerDescriptor*> registered_optimizers() {
    Registry& r = registry();
    const std::size_t n = r.count.load(std::memory_order_acquire);
    std::vector<const OptimizerDescriptor*> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(&r.slots[i]);
    return out;
}

std::string optimizer_names() {
    std::string s;
    for (const OptimizerDescriptor* d : registered_optimizers()) {
        s += str_cat(s.empty() ? "" : ", ", d->display_name);
    }
    return s;
}

std::string optimizer_names_where(bool (*has)(const OptimizerDescriptor&)) {
    std::vector<std::string_view> names;
    for (const OptimizerDescriptor* d : registered_optimizers()) {
        if (has(*d)) names.push_back(d->display_name);
    }
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i) {
        s += str_cat(i == 0 ? "" : i + 1 == names.size() ? " and " : ", ", names[i]);
    }
    return s;
}

std::string_view optimizer_kind_name(OptimizerKind kind) noexcept {
    return optimizer_descriptor(kind).name;
}

Result<OptimizerKind> register_optimizer_descriptor(const OptimizerDescriptor& descriptor) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (descriptor.name.empty() || descriptor.display_name.empty()) {
        return Status::invalid_argument("register optimizer: a name and a display name are needed");
    }
    if (find_optimizer(descriptor.name) != nullptr ||
        find_optimizer(descriptor.display_name) != nullptr) {
        return Status::invalid_argument(
            str_cat("register optimizer: the name ", descriptor.display_name, " is taken"));
    }
    if (descriptor.moment_count > kMaxMoments) {
        return Status::invalid_argument(str_cat("register optimizer ", descriptor.display_name,
                                                ": ", descriptor.moment_count, " moments; at most ",
                                                kMaxMoments));
    }
    const std::size_t n = r.count.load(std::memory_order_relaxed);
    if (n == kMaxOptimizers) {
        return Status::invalid_argument(str_cat("register optimizer ", descriptor.display_name,
                                                ": all ", kMaxOptimizers, " slots are taken"));
    }
    r.slots[n] = descriptor;
    r.slots[n].kind = static_cast<OptimizerKind>(n);
    r.count.store(n + 1, std::memory_order_release);
    return r.slots[n].kind;
}

}  // namespace zinf
