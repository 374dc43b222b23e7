// OptimizerDescriptor: everything the project knows about one optimizer except its arithmetic,
// in one place: its names, the moments it keeps per element (their names in checkpoints, in
// DeepSpeed and in torch, and their sign), which hyper-parameters it reads and their defaults.
// The config parser, the offload plan, the state stores, the NVMe swapper, checkpoints, the
// bench and the Python package all read it; the kernels attach the arithmetic
// (kernels::register_optimizer). Adding an optimizer is one descriptor plus its kernel and tests:
// kernels/README.md, "Adding an optimizer".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace zinf {

// An optimizer's id: the built-ins have fixed values (they index the kernels' tables); others
// get the next free value when they register.
enum class OptimizerKind : std::uint8_t {
    kAdam = 0,     // L2 mode: weight decay is added to the gradient (torch.optim.Adam)
    kAdamW = 1,    // decoupled weight decay (torch.optim.AdamW, DeepSpeed's adam_w_mode)
    kAdagrad = 2,  // torch.optim.Adagrad with lr_decay 0 and initial accumulator 0
    kLion = 3,     // Chen et al. 2023: sign of an interpolated momentum, decoupled decay
};
inline constexpr int kBuiltinOptimizerCount = 4;
// The most optimizers (built-in and registered) a process holds, and the most moments one keeps.
inline constexpr std::size_t kMaxOptimizers = 16;
inline constexpr std::size_t kMaxMoments = 3;

// One fp32 array the optimizer keeps per element besides the master parameters.
struct MomentDescriptor {
    // Its name in checkpoints (`<name>.fp32`), in messages and in DeepSpeed's optimizer state.
    std::string_view name;
    // Its key in torch.optim's state (Adagrad's running sum is "sum" there).
    std::string_view torch_name;
    // Never negative (a running sum of squares): a compressed store may use an unsigned code.
    bool non_negative = false;
    // Kept only with amsgrad (Adam's running maximum of exp_avg_sq).
    bool amsgrad_only = false;
};

struct OptimizerDescriptor {
    OptimizerKind kind = OptimizerKind::kAdamW;
    std::string_view name;          // lower case: config "type" (any case), logs, Python
    std::string_view display_name;  // DeepSpeed's spelling ("AdamW")
    // In the order the kernel takes them (the amsgrad-only ones last).
    std::array<MomentDescriptor, kMaxMoments> moments{};
    std::size_t moment_count = 0;
    // The hyper-parameters it reads: lr and weight_decay always; the others where set.
    bool uses_betas = false;  // betas (OneCycle's momentum cycling writes beta1)
    bool uses_eps = false;
    bool has_bias_correction = false;
    bool has_amsgrad = false;
    bool has_torch_rounding = false;  // kernels' torch.optim operation order
    double default_beta1 = 0.9;
    double default_beta2 = 0.999;

    // The moments kept with `amsgrad` (amsgrad-only ones dropped without it).
    std::size_t kept_moment_count(bool amsgrad) const noexcept;
    // Fp32 arrays per element: the master and the kept moments.
    std::size_t state_count(bool amsgrad) const noexcept { return 1 + kept_moment_count(amsgrad); }
};

// True once `kind` is registered (the built-ins always are).
bool optimizer_registered(OptimizerKind kind) noexcept;
// The descriptor of `kind` (asserts that it is registered).
const OptimizerDescriptor& optimizer_descriptor(OptimizerKind kind) noexcept;
// The optimizer named `name` (any case; display or lower-case name), or null.
const OptimizerDescriptor* find_optimizer(std::string_view name) noexcept;
// Every registered optimizer, built-ins first (for help texts, the bench and Python).
std::vector<const OptimizerDescriptor*> registered_optimizers();
// "Adam, AdamW, Adagrad, Lion": the display names, for messages.
std::string optimizer_names();
std::string_view optimizer_kind_name(OptimizerKind kind) noexcept;
// "Adam and AdamW": the display names of the optimizers for which `has` holds, for messages.
std::string optimizer_names_where(bool (*has)(const OptimizerDescriptor&));
inline bool has_amsgrad(const OptimizerDescriptor& d) noexcept {
    return d.has_amsgrad;
}
inline bool has_bias_correction(const OptimizerDescriptor& d) noexcept {
    return d.has_bias_correction;
}
inline bool has_torch_rounding(const OptimizerDescriptor& d) noexcept {
    return d.has_torch_rounding;
}
// One of the built-in optimizers (they alone have compressed-state kernels).
inline bool is_builtin(const OptimizerDescriptor& d) noexcept {
    return static_cast<int>(d.kind) < kBuiltinOptimizerCount;
}

// Adds an optimizer; its kind field is ignored and the assigned kind is returned. Its names
// must outlive the process (string literals). Call before
// any other thread looks optimizers up (e.g. at static initialisation, as tests do, or at
// start-up). Errors: kInvalidArgument for an empty or taken name, too many moments or
// optimizers. The arithmetic is attached by kernels::register_optimizer, which calls this.
Result<OptimizerKind> register_optimizer_descriptor(const OptimizerDescriptor& descriptor);

}  // namespace zinf
