// The helpers every binding file of zinfinity._C shares: Status to Python exceptions, raw
// addresses, dtype and optimizer names, and the bind_* function of each area (module.cc calls
// them in turn). See python/README.md for what the module is and is not.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "io/engine.h"
#include "kernels/optimizer.h"
#include "src/base/dtype.h"
#include "src/base/status.h"

namespace zinf::python {

namespace py = pybind11;

// zinfinity.CorruptionError (set by the module at import; module lifetime).
extern PyObject* g_corruption_error;

// A Status that is not ok as the matching Python exception: ValueError (bad argument),
// FileNotFoundError, zinfinity.CorruptionError (a checksum mismatch), OSError (I/O, disk full),
// TimeoutError, RuntimeError (the rest); the message is the engine's.
[[noreturn]] void raise(const Status& status);
inline void check(const Status& status) {
    if (!status.is_ok()) raise(status);
}
template <typename T>
T take(Result<T> result) {
    if (!result.has_value()) raise(result.error());
    return std::move(result).value();
}

// "float32", "bfloat16", "float16" (torch's names).
DType dtype_from(const std::string& name);
// Any registered optimizer's name (src/base/optimizer_descriptor.h), in any case.
OptimizerKind kind_from(const std::string& name);

template <typename T>
T* address(std::uintptr_t value) {
    return reinterpret_cast<T*>(value);  // NOLINT(performance-no-int-to-ptr): Python's addresses
}

// DeepSpeed's aio settings as the I/O engine takes them (each count positive, else ValueError);
// use_direct: O_DIRECT where the file system takes it.
io::AioOptions aio_from(std::uint64_t block_size, int queue_depth, bool single_submit,
                        bool overlap_events, int intra_op_parallelism, const std::string& backend,
                        bool use_direct);

// One step's hyper-parameters, validated (kernels::validate).
kernels::OptimizerParams hyper_from(const std::string& kind, std::uint64_t step, double lr,
                                    double beta1, double beta2, double eps, double weight_decay,
                                    bool bias_correction, bool amsgrad, double grad_scale,
                                    bool torch_rounding);

// The areas: the CPU optimizer kernel and casts; locked buffers and the aio handle; the NVMe
// optimizer.
void bind_kernels(py::module_& m);
void bind_io(py::module_& m);
void bind_offload(py::module_& m);
void bind_engine(py::module_& m);

}  // namespace zinf::python
