// The shared helpers of zinfinity._C's binding files.
#include "python/binding.h"

#include "io/engine.h"
#include "src/base/log.h"
#include "src/base/optimizer_descriptor.h"

namespace zinf::python {

PyObject* g_corruption_error = nullptr;

[[noreturn]] void raise(const Status& status) {
    PyObject* type = PyExc_RuntimeError;
    switch (status.code()) {
        case StatusCode::kInvalidArgument:
            type = PyExc_ValueError;
            break;
        case StatusCode::kNotFound:
            type = PyExc_FileNotFoundError;
            break;
        case StatusCode::kCorruption:
            type = g_corruption_error;
            break;
        case StatusCode::kIo:
        case StatusCode::kNoSpace:
            type = PyExc_OSError;
            break;
        case StatusCode::kTimeout:
            type = PyExc_TimeoutError;
            break;
        default:
            break;
    }
    PyErr_SetString(type, status.to_string().c_str());
    throw py::error_already_set();
}

DType dtype_from(const std::string& name) {
    if (name == "float32") return DType::kFloat32;
    if (name == "bfloat16") return DType::kBFloat16;
    if (name == "float16") return DType::kFloat16;
    raise(Status::invalid_argument(
        str_cat("dtype ", name, ": expected float32, bfloat16 or float16")));
}

OptimizerKind kind_from(const std::string& name) {
    const OptimizerDescriptor* d = find_optimizer(name);
    if (d == nullptr) {
        raise(Status::invalid_argument(
            str_cat("optimizer ", name, ": expected one of ", optimizer_names())));
    }
    return d->kind;
}

kernels::OptimizerParams hyper_from(const std::string& kind, std::uint64_t step, double lr,
                                    double beta1, double beta2, double eps, double weight_decay,
                                    bool bias_correction, bool amsgrad, double grad_scale,
                                    bool torch_rounding) {
    kernels::OptimizerParams p;
    p.kind = kind_from(kind);
    p.step = step;
    p.lr = lr;
    p.beta1 = beta1;
    p.beta2 = beta2;
    p.eps = eps;
    p.weight_decay = weight_decay;
    p.bias_correction = bias_correction;
    p.amsgrad = amsgrad;
    p.grad_scale = grad_scale;
    p.torch_rounding = torch_rounding;
    check(kernels::validate(p));
    return p;
}

io::AioOptions aio_from(std::uint64_t block_size, int queue_depth, bool single_submit,
                        bool overlap_events, int intra_op_parallelism, const std::string& backend,
                        bool use_direct) {
    if (block_size == 0 || queue_depth <= 0 || intra_op_parallelism <= 0) {
        raise(Status::invalid_argument(str_cat("aio: block_size ", block_size, ", queue_depth ",
                                               queue_depth, ", intra_op_parallelism ",
                                               intra_op_parallelism, ": each must be positive")));
    }
    io::AioOptions a;
    a.block_size_bytes = block_size;
    a.queue_depth = queue_depth;
    a.single_submit = single_submit;
    a.overlap_events = overlap_events;
    a.intra_op_parallelism = intra_op_parallelism;
    a.backend = backend;
    a.use_direct = use_direct ? io::DirectMode::kAuto : io::DirectMode::kOff;
    return a;
}

}  // namespace zinf::python
