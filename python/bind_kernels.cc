// zinfinity._C's kernels: the CPU optimizer step on raw arrays, its threads and variant, and the
// casts between fp32 and bf16/fp16.
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "python/binding.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/base/optimizer_descriptor.h"

namespace zinf::python {
namespace {

// One kernel for the process: its threads are created once. set_num_threads replaces it.
struct KernelHolder {
    std::mutex mutex;
    std::unique_ptr<kernels::OptimizerKernel> kernel;
    int threads = 0;
};
KernelHolder& holder() {
    static KernelHolder h;
    return h;
}

// Creates the kernel on first use. Returns a Status rather than raising: it may run without
// the GIL (inside a step).
Status ensure_kernel_locked(KernelHolder& h) {
    if (h.kernel) return Status::ok();
    auto kernel = kernels::OptimizerKernel::create(std::string_view("auto"), h.threads);
    if (!kernel.has_value()) return kernel.error();
    h.kernel = std::make_unique<kernels::OptimizerKernel>(std::move(kernel).value());
    return Status::ok();
}

void set_num_threads(int threads) {
    if (threads < 0)
        raise(Status::invalid_argument(str_cat("threads ", threads, ": must be >= 0")));
    KernelHolder& h = holder();
    std::lock_guard lock(h.mutex);
    h.threads = threads;
    h.kernel.reset();
}

py::dict kernel_info() {
    KernelHolder& h = holder();
    std::lock_guard lock(h.mutex);
    check(ensure_kernel_locked(h));
    const kernels::OptimizerKernel& k = *h.kernel;
    py::dict d;
    d["isa"] = std::string(kernels::isa_name(k.isa()));
    d["threads"] = k.threads();
    return d;
}

// One step over one tensor: params (fp32, numel), grads (grad_dtype), the states the optimizer
// uses (0 where it uses none), and optionally a bf16/fp16 copy of the new parameters.
void optimizer_step(const std::string& kind, std::uint64_t numel, std::uintptr_t params,
                    std::uintptr_t grads, const std::string& grad_dtype,
                    const std::vector<std::uintptr_t>& moments, std::uintptr_t copy,
                    const std::string& copy_dtype, std::uint64_t step, double lr, double beta1,
                    double beta2, double eps, double weight_decay, bool bias_correction,
                    bool amsgrad, double grad_scale, bool torch_rounding) {
    const kernels::OptimizerParams p =
        hyper_from(kind, step, lr, beta1, beta2, eps, weight_decay, bias_correction, amsgrad,
                   grad_scale, torch_rounding);
    if (numel == 0) return;
    auto floats = [numel](std::uintptr_t a) {
        return a == 0 ? std::span<float>() : std::span<float>(address<float>(a), numel);
    };
    // The kept moments in the descriptor's order (optimizer_descriptors()).
    const std::size_t kept = optimizer_descriptor(p.kind).kept_moment_count(p.amsgrad);
    kernels::OptimizerState state;
    state.params = floats(params);
    bool complete = !state.params.empty() && grads != 0 && moments.size() == kept;
    for (std::size_t i = 0; i < kept && complete; ++i) {
        state.moments[i] = floats(moments[i]);
        complete = moments[i] != 0;
    }
    if (!complete) {
        raise(
            Status::invalid_argument(str_cat("optimizer_step: ", kind, " needs params, grads and ",
                                             kept, " moments (given ", moments.size(), ")")));
    }
    const kernels::GradView g{address<const void>(grads), numel, dtype_from(grad_dtype)};
    kernels::ParamCopy c = kernels::ParamCopy::none();
    if (copy != 0) {
        c = {address<std::uint16_t>(copy), numel, dtype_from(copy_dtype)};
        if (c.dtype == DType::kFloat32) {
            raise(Status::invalid_argument("optimizer_step: the parameter copy is bf16 or fp16"));
        }
    }
    KernelHolder& h = holder();
    Status status;
    {
        py::gil_scoped_release release;
        std::lock_guard lock(h.mutex);
        status = ensure_kernel_locked(h);
        if (status.is_ok()) status = h.kernel->step(p, state, g, c);
    }
    check(status);
}

// Casts between fp32 and bf16/fp16 (torch's rounding: to nearest even).
void cast(std::uintptr_t src, const std::string& src_dtype, std::uintptr_t dst,
          const std::string& dst_dtype, std::uint64_t numel) {
    const DType s = dtype_from(src_dtype);
    const DType d = dtype_from(dst_dtype);
    const kernels::Isa isa = take(kernels::resolve_isa("auto"));
    py::gil_scoped_release release;
    if (s == DType::kFloat32 && d != DType::kFloat32) {
        kernels::cast_from_fp32(isa, {address<const float>(src), numel},
                                {address<std::uint16_t>(dst), numel}, d);
    } else if (s != DType::kFloat32 && d == DType::kFloat32) {
        kernels::cast_to_fp32(isa, {address<const std::uint16_t>(src), numel}, s,
                              {address<float>(dst), numel});
    } else {
        std::memcpy(address<void>(dst), address<const void>(src), numel * dtype_size_bytes(s));
    }
}

// Every registered optimizer's descriptor (src/base/optimizer_descriptor.h): the Python package
// takes its state keys and flags from here instead of writing them again.
py::list optimizer_descriptors() {
    py::list out;
    for (const OptimizerDescriptor* d : registered_optimizers()) {
        py::list moments;
        for (std::size_t i = 0; i < d->moment_count; ++i) {
            const MomentDescriptor& mo = d->moments[i];
            py::dict md;
            md["name"] = std::string(mo.name);
            md["torch_name"] = std::string(mo.torch_name);
            md["non_negative"] = mo.non_negative;
            md["amsgrad_only"] = mo.amsgrad_only;
            moments.append(md);
        }
        py::dict dd;
        dd["name"] = std::string(d->name);
        dd["display_name"] = std::string(d->display_name);
        dd["moments"] = moments;
        dd["uses_betas"] = d->uses_betas;
        dd["uses_eps"] = d->uses_eps;
        dd["has_bias_correction"] = d->has_bias_correction;
        dd["has_amsgrad"] = d->has_amsgrad;
        dd["has_torch_rounding"] = d->has_torch_rounding;
        dd["default_betas"] = py::make_tuple(d->default_beta1, d->default_beta2);
        out.append(dd);
    }
    return out;
}

}  // namespace

void bind_kernels(py::module_& m) {
    m.def("optimizer_descriptors", &optimizer_descriptors);
    m.def("set_num_threads", &set_num_threads, py::arg("threads"));
    m.def("kernel_info", &kernel_info);
    m.def("optimizer_step", &optimizer_step, py::arg("kind"), py::arg("numel"), py::arg("params"),
          py::arg("grads"), py::arg("grad_dtype"), py::arg("moments"), py::arg("copy"),
          py::arg("copy_dtype"), py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
          py::arg("eps"), py::arg("weight_decay"), py::arg("bias_correction"), py::arg("amsgrad"),
          py::arg("grad_scale") = 1.0, py::arg("torch_rounding") = false);
    m.def("cast", &cast, py::arg("src"), py::arg("src_dtype"), py::arg("dst"), py::arg("dst_dtype"),
          py::arg("numel"));
}

}  // namespace zinf::python
