// zinfinity._C: the engine's CPU optimizer kernel, the asynchronous I/O engine and the NVMe
// optimizer swapper, bound for Python. The binding takes raw addresses, element counts and
// dtypes; the Python package (python/zinfinity) checks every torch tensor (CPU, contiguous,
// dtype, size, alignment) before it hands one over, and keeps it alive while an operation uses
// it. So the module needs pybind11 only, not libtorch: it builds in seconds and works with any
// torch the Python side imports.
//
// Every call that may block (a step, a wait, a synchronous transfer) releases the GIL. A Status
// that is not ok becomes a Python exception: ValueError (bad argument), FileNotFoundError,
// zinfinity.CorruptionError (a checksum mismatch on a swap read), OSError (I/O, disk full),
// TimeoutError, RuntimeError (the rest); the message is the engine's, naming path, offset,
// partition and cause.
#include <pybind11/pybind11.h>

#include <cstdlib>

#include "python/binding.h"
#include "src/base/log.h"

PYBIND11_MODULE(_C, m) {
    namespace zp = zinf::python;
    m.doc() = "zinfinity's engine parts (use the zinfinity package, not this module)";
    if (std::getenv("ZINF_LOG_LEVEL") == nullptr) zinf::log::set_level(zinf::log::Level::kWarning);
    static pybind11::exception<std::runtime_error> corruption(m, "CorruptionError", PyExc_OSError);
    zp::g_corruption_error = corruption.ptr();
    zp::bind_kernels(m);
    zp::bind_io(m);
    zp::bind_offload(m);
    zp::bind_engine(m);
}
