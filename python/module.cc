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
#include <pybind11/stl.h>
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

#include "io/engine.h"
#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/base/status.h"
#include "swap/optimizer_stack.h"
#include "swap/optimizer_swapper.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"

namespace py = pybind11;

namespace zinf::python {
namespace {

PyObject* g_corruption_error = nullptr;  // zinfinity.CorruptionError (module lifetime)

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

void check(const Status& status) {
    if (!status.is_ok()) raise(status);
}

template <typename T>
T take(Result<T> result) {
    if (!result.has_value()) raise(result.error());
    return std::move(result).value();
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

template <typename T>
T* address(std::uintptr_t value) {
    return reinterpret_cast<T*>(value);
}

// ----- the CPU optimizer kernel --------------------------------------------------------------

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

// One step over one tensor: params (fp32, numel), grads (grad_dtype), the states the optimizer
// uses (0 where it uses none), and optionally a bf16/fp16 copy of the new parameters.
void optimizer_step(const std::string& kind, std::uint64_t numel, std::uintptr_t params,
                    std::uintptr_t grads, const std::string& grad_dtype, std::uintptr_t exp_avg,
                    std::uintptr_t exp_avg_sq, std::uintptr_t max_exp_avg_sq, std::uintptr_t copy,
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
    // The kept moments in the descriptor's order, each taken from the argument of its name.
    const OptimizerDescriptor& d = optimizer_descriptor(p.kind);
    kernels::OptimizerState state;
    state.params = floats(params);
    bool complete = !state.params.empty() && grads != 0;
    for (std::size_t i = 0; i < d.kept_moment_count(p.amsgrad); ++i) {
        const std::string_view name = d.moments[i].name;
        const std::uintptr_t a = name == "exp_avg"      ? exp_avg
                                 : name == "exp_avg_sq" ? exp_avg_sq
                                 : name == "max_exp_avg_sq" ? max_exp_avg_sq
                                                            : 0;
        state.moments[i] = floats(a);
        complete = complete && a != 0;
    }
    if (!complete) {
        raise(Status::invalid_argument(
            str_cat("optimizer_step: ", kind, " needs params, grads and its states")));
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
        std::memcpy(address<void>(dst), address<const void>(src),
                    numel * dtype_size_bytes(s));
    }
}

// ----- page-aligned, locked host memory --------------------------------------------------------

// A page-aligned, mlock'ed allocation exposed through the buffer protocol (torch.frombuffer
// wraps it without a copy and keeps it alive).
class LockedBuffer {
public:
    explicit LockedBuffer(std::size_t bytes) {
        buffer_ = take(AlignedBuffer::allocate(std::max<std::size_t>(bytes, 1), 4096, true));
        if (::mlock(buffer_.data(), buffer_.size()) != 0) {
            const int err = errno;
            raise(Status::from_errno(err, str_cat("mlock of ", buffer_.size(),
                                                  " bytes (RLIMIT_MEMLOCK: see ulimit -l)")));
        }
        bytes_ = bytes;
    }
    ~LockedBuffer() {
        if (buffer_.data() != nullptr) ::munlock(buffer_.data(), buffer_.size());
    }
    LockedBuffer(const LockedBuffer&) = delete;
    LockedBuffer& operator=(const LockedBuffer&) = delete;

    py::buffer_info info() {
        return py::buffer_info(buffer_.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(bytes_)}, {1});
    }
    std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(buffer_.data()); }
    std::size_t size() const { return bytes_; }

private:
    AlignedBuffer buffer_;
    std::size_t bytes_ = 0;
};

// ----- asynchronous file I/O ------------------------------------------------------------------

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

// DeepSpeed's aio_handle over io::Engine: each operation opens its file, moves its bytes in
// block_size pieces on the engine's workers, and closes the file when waited for.
class AioHandle {
public:
    AioHandle(std::uint64_t block_size, int queue_depth, bool single_submit, bool overlap_events,
              int intra_op_parallelism, const std::string& backend, bool use_direct) {
        io::EngineOptions eo;
        eo.aio = aio_from(block_size, queue_depth, single_submit, overlap_events,
                          intra_op_parallelism, backend, use_direct);
        engine_ = take(io::Engine::create(eo));
    }
    ~AioHandle() {
        std::vector<std::unique_ptr<Op>> ops = std::move(ops_);
        py::gil_scoped_release release;
        (void)drain(ops);
    }

    // Starts a transfer; returns without waiting. Errors before anything starts (bad path, a
    // read past the end of the file, a buffer the file's O_DIRECT alignment refuses).
    void submit(bool write, std::uintptr_t buffer, std::uint64_t bytes, const std::string& path,
                std::uint64_t offset) {
        auto op = std::make_unique<Op>();
        op->path = path;
        op->offset = offset;
        op->write = write;
        op->bytes = bytes;
        Status status;
        {
            py::gil_scoped_release release;
            status = start(*op, buffer);
        }
        check(status);
        ops_.push_back(std::move(op));
    }

    // Waits for every operation started; returns how many completed. Every one is waited for
    // even when one fails; then the first error is raised.
    std::size_t wait() {
        // Taken while the GIL is held: another Python thread may start operations meanwhile;
        // they belong to the next wait.
        std::vector<std::unique_ptr<Op>> ops = std::move(ops_);
        ops_.clear();
        const std::size_t n = ops.size();
        Status status;
        {
            py::gil_scoped_release release;
            status = drain(ops);
        }
        check(status);
        return n;
    }

    std::size_t pending() const { return ops_.size(); }
    const io::AioOptions& aio() const { return engine_->aio(); }
    std::string backend() const { return std::string(engine_->backend_name()); }
    py::dict stats() const {
        const io::EngineStats s = engine_->stats();
        py::dict d;
        d["bytes_read"] = s.bytes_read;
        d["bytes_written"] = s.bytes_written;
        d["requests_completed"] = s.requests_completed;
        d["pieces_completed"] = s.pieces_completed;
        d["pieces_fixed_buffer"] = s.pieces_fixed_buffer_read + s.pieces_fixed_buffer_written;
        return d;
    }
    bool is_direct(const std::string& path) {
        io::FileOptions fo;
        fo.read_only = true;
        const io::FileId file = take(engine_->open(path, fo));
        const bool direct = engine_->is_direct(file);
        check(engine_->close(file));
        return direct;
    }

private:
    struct Op {
        io::IoHandle handle;
        std::optional<io::FileId> file;
        std::string path;
        std::uint64_t offset = 0;
        std::uint64_t bytes = 0;
        bool write = false;
        bool started = false;
    };

    Status start(Op& op, std::uintptr_t buffer) {
        if (op.bytes == 0) return Status::invalid_argument(str_cat(op.path, ": an empty tensor"));
        io::FileOptions fo;
        fo.create = op.write;
        fo.read_only = !op.write;
        ZINF_ASSIGN_OR_RETURN(const io::FileId file, engine_->open(op.path, fo));
        op.file = file;
        Status status = check_op(op, file, buffer);
        if (status.is_ok()) {
            auto* data = address<std::byte>(buffer);
            status = op.write ? engine_->submit_write(op.handle, file, op.offset, {data, op.bytes})
                              : engine_->submit_read(op.handle, file, op.offset, {data, op.bytes});
        }
        if (!status.is_ok()) {
            (void)engine_->close(file);
            op.file.reset();
            return status;
        }
        op.started = true;
        return Status::ok();
    }

    Status check_op(const Op& op, io::FileId file, std::uintptr_t buffer) {
        const std::size_t align = engine_->alignment_bytes(file);
        if (engine_->is_direct(file) && buffer % align != 0) {
            return Status::invalid_argument(str_cat(
                op.path, ": the tensor's data at 0x", std::hex, buffer, std::dec,
                " is not aligned to the file's ", align,
                "-byte O_DIRECT block; allocate it with new_cpu_locked_tensor (page-aligned)"));
        }
        if (!op.write) {
            struct stat st {};
            if (::stat(op.path.c_str(), &st) == 0 &&
                static_cast<std::uint64_t>(st.st_size) < op.offset + op.bytes) {
                return Status::invalid_argument(
                    str_cat(op.path, ": reading ", op.bytes, " bytes at offset ", op.offset,
                            " needs ", op.offset + op.bytes, " bytes; the file has ", st.st_size));
            }
        }
        return Status::ok();
    }

    Status drain(std::vector<std::unique_ptr<Op>>& ops) {
        Status first;
        for (auto& op : ops) {
            if (op->started) {
                Status s = op->handle.wait();
                if (!s.is_ok() && first.is_ok()) first = std::move(s);
            }
            if (op->file) {
                Status s = engine_->close(*op->file);
                if (!s.is_ok() && first.is_ok()) first = std::move(s);
            }
        }
        ops.clear();
        return first;
    }

    std::unique_ptr<io::Engine> engine_;
    std::vector<std::unique_ptr<Op>> ops_;
};

// ----- the NVMe optimizer ---------------------------------------------------------------------

// One tensor of a parameter group: the torch parameter (fp32, or bf16/fp16 with the master in
// the swap store) and its gradient, for one step.
struct Piece {
    std::uintptr_t param = 0;
    DType param_dtype = DType::kFloat32;
    std::uintptr_t grad = 0;
    DType grad_dtype = DType::kFloat32;
    std::uint64_t numel = 0;
};

std::vector<Piece> pieces_from(const py::list& list) {
    std::vector<Piece> out;
    out.reserve(list.size());
    for (const py::handle item : list) {
        const auto t = item.cast<py::tuple>();
        if (t.size() != 5)
            raise(Status::invalid_argument("piece: (param, dtype, grad, dtype, numel)"));
        Piece p;
        p.param = t[0].cast<std::uintptr_t>();
        p.param_dtype = dtype_from(t[1].cast<std::string>());
        p.grad = t[2].cast<std::uintptr_t>();
        p.grad_dtype =
            t[3].is_none() ? DType::kFloat32 : dtype_from(t[3].cast<std::string>());
        p.numel = t[4].cast<std::uint64_t>();
        out.push_back(p);
    }
    return out;
}

std::size_t dsize(DType d) {
    return dtype_size_bytes(d);
}

// Walks the tensors covering [offset, offset + numel) of a group's flat layout (anything with a
// `numel`: the pieces of a step, the state targets of read_states / write_states).
template <typename T, typename Fn>
void for_range(const std::vector<T>& pieces, std::uint64_t offset, std::uint64_t numel, Fn fn) {
    std::uint64_t start = 0;
    for (const T& p : pieces) {
        const std::uint64_t end = start + p.numel;
        if (p.numel > 0 && end > offset && start < offset + numel) {
            const std::uint64_t from = std::max(offset, start);
            const std::uint64_t to = std::min(offset + numel, end);
            fn(p, from - start, from - offset, to - from);  // piece offset, range offset, count
        }
        start = end;
        if (start >= offset + numel) break;
    }
}

// Gradients and parameter write-back of one group for OptimizerSwapper::step. A sub-group that
// lies in one tensor is read and written in place; one that spans tensors is gathered into (and
// scattered from) the optimizer's staging buffers.
class TorchGradients final : public swap::GradientSource {
public:
    // `grads` and `copy` are the optimizer's staging buffers, grown here on first need.
    TorchGradients(const std::vector<Piece>& pieces, DType grad_dtype,
                   DType param_dtype, std::uint64_t sub_group_numel,
                   std::vector<std::byte>& grads, std::vector<std::uint16_t>& copy)
        : pieces_(pieces),
          grad_dtype_(grad_dtype),
          param_dtype_(param_dtype),
          grads_(grads),
          copy_(copy) {
        if (grads_.size() < sub_group_numel * dsize(grad_dtype)) {
            grads_.resize(sub_group_numel * dsize(grad_dtype));
        }
        if (param_dtype != DType::kFloat32 && copy_.size() < sub_group_numel) {
            copy_.resize(sub_group_numel);
        }
    }

    Result<kernels::GradView> gradients(std::size_t, std::uint64_t offset,
                                        std::uint64_t numel) override {
        const Piece* one = single(offset, numel);
        if (one != nullptr) {
            const std::uint64_t at = offset - start_of(one);
            return kernels::GradView{address<const std::byte>(one->grad) + at * dsize(grad_dtype_),
                                     numel, grad_dtype_};
        }
        const std::size_t es = dsize(grad_dtype_);
        for_range(pieces_, offset, numel,
                  [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                      std::memcpy(grads_.data() + ro * es,
                                  address<const std::byte>(p.grad) + po * es, n * es);
                  });
        return kernels::GradView{grads_.data(), numel, grad_dtype_};
    }

    kernels::ParamCopy param_copy(std::size_t, std::uint64_t offset, std::uint64_t numel) override {
        if (param_dtype_ == DType::kFloat32) return kernels::ParamCopy::none();
        const Piece* one = single(offset, numel);
        std::uint16_t* dst = one != nullptr
                                 ? address<std::uint16_t>(one->param) + (offset - start_of(one))
                                 : copy_.data();
        return {dst, numel, param_dtype_};
    }

    Status updated(std::size_t, std::uint64_t offset, std::span<const float> params) override {
        const std::uint64_t numel = params.size();
        if (param_dtype_ != DType::kFloat32) {
            if (single(offset, numel) != nullptr) return Status::ok();  // written in place
            for_range(pieces_, offset, numel,
                      [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                          std::memcpy(address<std::uint16_t>(p.param) + po, copy_.data() + ro,
                                      n * 2);
                      });
            return Status::ok();
        }
        for_range(pieces_, offset, numel,
                  [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                      std::memcpy(address<float>(p.param) + po, params.data() + ro,
                                  n * sizeof(float));
                  });
        return Status::ok();
    }

private:
    std::uint64_t start_of(const Piece* piece) const {
        std::uint64_t start = 0;
        for (const Piece& p : pieces_) {
            if (&p == piece) return start;
            start += p.numel;
        }
        return start;
    }
    const Piece* single(std::uint64_t offset, std::uint64_t numel) const {
        std::uint64_t start = 0;
        for (const Piece& p : pieces_) {
            if (offset >= start && offset + numel <= start + p.numel) return &p;
            start += p.numel;
            if (start > offset) return nullptr;
        }
        return nullptr;
    }

    const std::vector<Piece>& pieces_;
    DType grad_dtype_;
    DType param_dtype_;
    std::vector<std::byte>& grads_;
    std::vector<std::uint16_t>& copy_;
};

// Fills the initial fp32 masters from the torch parameters.
class TorchParams final : public swap::ParamSource {
public:
    TorchParams(const std::vector<Piece>& pieces, kernels::Isa isa) : pieces_(pieces), isa_(isa) {}
    Status fill(std::size_t, std::uint64_t offset, std::span<float> params) override {
        for_range(pieces_, offset, params.size(),
                  [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                      if (p.param_dtype == DType::kFloat32) {
                          std::memcpy(params.data() + ro, address<const float>(p.param) + po,
                                      n * sizeof(float));
                      } else {
                          kernels::cast_to_fp32(isa_,
                                                {address<const std::uint16_t>(p.param) + po, n},
                                                p.param_dtype, params.subspan(ro, n));
                      }
                  });
        return Status::ok();
    }

private:
    const std::vector<Piece>& pieces_;
    kernels::Isa isa_;
};

// The fp32 masters and optimizer states of several parameter groups in one swap store on NVMe:
// one OptimizerSwapper per group (its own sub-groups and partitions), one pinned pool and one
// I/O engine for all.
class NvmeOptimizer {
public:
    NvmeOptimizer(const std::vector<std::uint64_t>& group_numels, const std::string& kind,
                  bool amsgrad, const std::vector<std::string>& nvme_paths,
                  std::uint64_t sub_group_size, std::uint64_t block_size, int queue_depth,
                  bool single_submit, bool overlap_events, int intra_op_parallelism,
                  const std::string& backend, bool pipeline_read, bool pipeline_write,
                  bool verify_checksums, int threads) {
        if (group_numels.empty() || sub_group_size == 0 || nvme_paths.empty()) {
            raise(Status::invalid_argument(
                "NVMeOptimizer: needs parameters, a positive sub_group_size and an nvme_path"));
        }
        kind_ = kind_from(kind);
        amsgrad_ = amsgrad;
        isa_ = take(kernels::resolve_isa("auto"));
        kernel_ = std::make_unique<kernels::OptimizerKernel>(
            take(kernels::OptimizerKernel::create(std::string_view("auto"), threads)));
        io::EngineOptions eo;
        eo.aio = aio_from(block_size, queue_depth, single_submit, overlap_events,
                          intra_op_parallelism, backend, true);
        engine_ = take(io::Engine::create(eo));
        swap::SwapStoreOptions so;
        so.paths = nvme_paths;
        so.verify_checksums = verify_checksums;
        so.name = "optimizer";
        store_ = take(swap::SwapStore::create(*engine_, so));

        // Sized and wired as the engine's NVMe optimizer is (swap/optimizer_stack.h).
        swap::OptimizerStackOptions stack;
        stack.group_numels = group_numels;
        stack.sub_group_numel = sub_group_size;
        stack.kind = kind_;
        stack.amsgrad = amsgrad;
        stack.pipeline_read = pipeline_read;
        stack.pipeline_write = pipeline_write;
        stack.pool_name = "optimizer";
        const swap::OptimizerStackLayout layout = take(swap::layout_optimizer_stack(stack));
        pool_ = take(swap::create_optimizer_pool(layout, *engine_, nullptr, false));
        swappers_ = take(swap::create_optimizer_swappers(layout, *store_, *pool_, *kernel_));
        check(store_->commit());
    }

    ~NvmeOptimizer() {
        // The swappers, the store (it removes its run directory), then the pool and engine.
        swappers_.clear();
        store_.reset();
        pool_.reset();
        engine_.reset();
    }

    void initialize(std::size_t group, const py::list& list) {
        const std::vector<Piece> pieces = pieces_from(list);
        swap::OptimizerSwapper& s = swapper(group, pieces);
        TorchParams source(pieces, isa_);
        Status status;
        {
            py::gil_scoped_release release;
            status = s.initialize(source);
        }
        check(status);
    }

    py::dict step(std::size_t group, const py::list& list, std::uint64_t step, double lr,
                  double beta1, double beta2, double eps, double weight_decay, bool bias_correction,
                  double grad_scale, bool torch_rounding) {
        const std::vector<Piece> pieces = pieces_from(list);
        swap::OptimizerSwapper& s = swapper(group, pieces);
        const kernels::OptimizerParams p =
            hyper_from(std::string(optimizer_kind_name(kind_)), step, lr, beta1, beta2,
                       eps, weight_decay, bias_correction, amsgrad_, grad_scale, torch_rounding);
        // The dtypes of the group's first non-empty parameter (an empty one has no gradient
        // storage and takes no part).
        const Piece* first = &pieces.front();
        for (const Piece& piece : pieces) {
            if (piece.numel > 0) {
                first = &piece;
                break;
            }
        }
        const DType gd = first->grad_dtype;
        const DType pd = first->param_dtype;
        for (std::size_t i = 0; i < pieces.size(); ++i) {
            if (pieces[i].numel == 0) continue;
            if (pieces[i].grad == 0) {
                raise(Status::invalid_argument(
                    str_cat("NVMeOptimizer: parameter ", i, " of group ", group,
                            " has no gradient; a group steps all its parameters together")));
            }
            if (pieces[i].grad_dtype != gd || pieces[i].param_dtype != pd) {
                raise(Status::invalid_argument(
                    str_cat("NVMeOptimizer: parameter ", i, " of group ", group,
                            " differs in dtype from the group's first; one dtype per group")));
            }
        }
        TorchGradients grads(pieces, gd, pd, s.options().sub_group_numel, grad_stage_, copy_stage_);
        Status status;
        {
            py::gil_scoped_release release;
            status = s.step(p, grads);
        }
        check(status);
        const swap::OptimizerStepStats& st = s.last_step_stats();
        py::dict d;
        d["seconds"] = st.seconds;
        d["compute_seconds"] = st.compute_seconds;
        d["read_wait_seconds"] = st.read_wait_seconds;
        d["write_wait_seconds"] = st.write_wait_seconds;
        d["bytes_read"] = st.bytes_read;
        d["bytes_written"] = st.bytes_written;
        return d;
    }

    // Streams one group's masters and states into (read) or out of (write) per-tensor fp32
    // arrays, one sub-group at a time. `targets` holds, per tensor, (numel, master, exp_avg,
    // exp_avg_sq, max_exp_avg_sq) addresses, 0 for a state the optimizer does not keep.
    void transfer(std::size_t group, const py::list& targets, bool write) {
        std::vector<Target> ts;
        for (const py::handle item : targets) {
            const auto t = item.cast<py::tuple>();
            ts.push_back({t[0].cast<std::uint64_t>(),
                          {t[1].cast<std::uintptr_t>(), t[2].cast<std::uintptr_t>(),
                           t[3].cast<std::uintptr_t>(), t[4].cast<std::uintptr_t>()}});
        }
        if (group >= swappers_.size())
            raise(Status::invalid_argument("NVMeOptimizer: no such group"));
        swap::OptimizerSwapper& s = *swappers_[group];
        std::uint64_t total = 0;
        for (const Target& t : ts) total += t.numel;
        if (total != s.options().numel) {
            raise(Status::invalid_argument(str_cat("NVMeOptimizer: group ", group, " holds ",
                                                   s.options().numel, " elements; given ", total)));
        }
        // State slots in the swapper's order: master, exp_avg, exp_avg_sq, max_exp_avg_sq.
        Status status;
        {
            py::gil_scoped_release release;
            status = stream(s, ts, write);
        }
        check(status);
    }

    std::vector<std::string> swap_files() const { return store_->data_file_paths(); }
    std::size_t sub_group_count(std::size_t group) const {
        return group < swappers_.size() ? swappers_[group]->sub_group_count() : 0;
    }
    std::string backend() const { return std::string(engine_->backend_name()); }
    std::uint64_t bytes_on_disk() const { return store_->data_bytes(); }

private:
    struct Target {
        std::uint64_t numel;
        std::uintptr_t arrays[4];
    };

    // Target arrays: [0] the master, then exp_avg, exp_avg_sq, max_exp_avg_sq (0 where absent);
    // the swapper's are the master, then the kept moments in the descriptor's order.
    Status stream(swap::OptimizerSwapper& s, const std::vector<Target>& ts, bool write) {
        const OptimizerDescriptor& d = optimizer_descriptor(kind_);
        const std::size_t kept = d.kept_moment_count(amsgrad_);
        std::size_t target_of[1 + kMaxMoments] = {0};
        for (std::size_t i = 0; i < kept; ++i) {
            const std::string_view name = d.moments[i].name;
            target_of[i + 1] = name == "exp_avg" ? 1 : name == "exp_avg_sq" ? 2 : 3;
        }
        Status status;
        const std::uint64_t n = s.options().sub_group_numel;
        std::vector<float> buf[1 + kMaxMoments];
        for (std::size_t k = 0; k <= kept; ++k) buf[k].resize(n);
        for (std::size_t g = 0; g < s.sub_group_count() && status.is_ok(); ++g) {
            const std::uint64_t numel = s.sub_group_numel(g);
            const std::uint64_t offset = s.sub_group_offset_numel(g);
            std::span<float> spans[1 + kMaxMoments];
            for (std::size_t k = 0; k <= kept; ++k) spans[k] = {buf[k].data(), numel};
            auto walk = [&](bool into_targets) {
                for_range(
                    ts, offset, numel,
                    [&](const Target& t, std::uint64_t po, std::uint64_t ro, std::uint64_t n_copy) {
                        for (std::size_t k = 0; k <= kept; ++k) {
                            const std::uintptr_t theirs_at = t.arrays[target_of[k]];
                            if (theirs_at == 0) continue;
                            float* mine = spans[k].data() + ro;
                            float* theirs = address<float>(theirs_at) + po;
                            if (into_targets)
                                std::memcpy(theirs, mine, n_copy * sizeof(float));
                            else
                                std::memcpy(mine, theirs, n_copy * sizeof(float));
                        }
                    });
            };
            if (write) {
                for (std::size_t k = 1; k <= kept; ++k) {
                    std::fill(spans[k].begin(), spans[k].end(), 0.0f);
                }
                walk(false);
                std::span<const float> moments[kMaxMoments];
                for (std::size_t k = 0; k < kept; ++k) moments[k] = spans[k + 1];
                status = s.write_sub_group(g, spans[0], {moments, kept});
            } else {
                status = s.read_sub_group(g, spans[0], {spans + 1, kept});
                if (status.is_ok()) walk(true);
            }
        }
        return status;
    }

    swap::OptimizerSwapper& swapper(std::size_t group, const std::vector<Piece>& pieces) {
        if (group >= swappers_.size()) {
            raise(Status::invalid_argument(
                str_cat("NVMeOptimizer: group ", group, " of ", swappers_.size())));
        }
        std::uint64_t total = 0;
        for (const Piece& p : pieces) total += p.numel;
        if (pieces.empty() || total != swappers_[group]->options().numel) {
            raise(Status::invalid_argument(
                str_cat("NVMeOptimizer: group ", group, " was built for ",
                        swappers_[group]->options().numel, " elements; given ", total)));
        }
        return *swappers_[group];
    }

    OptimizerKind kind_ = OptimizerKind::kAdamW;
    bool amsgrad_ = false;
    kernels::Isa isa_ = kernels::Isa::kScalar;
    std::unique_ptr<kernels::OptimizerKernel> kernel_;
    std::unique_ptr<io::Engine> engine_;
    std::unique_ptr<swap::SwapStore> store_;
    std::unique_ptr<swap::PinnedPool> pool_;
    std::vector<std::unique_ptr<swap::OptimizerSwapper>> swappers_;
    // Staging for sub-groups that span tensors: kept across steps, grown on first need.
    std::vector<std::byte> grad_stage_;
    std::vector<std::uint16_t> copy_stage_;
};

}  // namespace
}  // namespace zinf::python

PYBIND11_MODULE(_C, m) {
    using namespace zinf::python;
    namespace zp = zinf::python;
    m.doc() = "zinfinity's engine parts (use the zinfinity package, not this module)";
    if (std::getenv("ZINF_LOG_LEVEL") == nullptr) zinf::log::set_level(zinf::log::Level::kWarning);

    static py::exception<std::runtime_error> corruption(m, "CorruptionError", PyExc_OSError);
    zp::g_corruption_error = corruption.ptr();

    m.def("set_num_threads", &zp::set_num_threads, py::arg("threads"));
    m.def("kernel_info", &zp::kernel_info);
    m.def("optimizer_step", &zp::optimizer_step, py::arg("kind"), py::arg("numel"),
          py::arg("params"), py::arg("grads"), py::arg("grad_dtype"), py::arg("exp_avg"),
          py::arg("exp_avg_sq"), py::arg("max_exp_avg_sq"), py::arg("copy"), py::arg("copy_dtype"),
          py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
          py::arg("weight_decay"), py::arg("bias_correction"), py::arg("amsgrad"),
          py::arg("grad_scale") = 1.0, py::arg("torch_rounding") = false);
    m.def("cast", &zp::cast, py::arg("src"), py::arg("src_dtype"), py::arg("dst"),
          py::arg("dst_dtype"), py::arg("numel"));

    py::class_<zp::LockedBuffer>(m, "LockedBuffer", py::buffer_protocol())
        .def(py::init<std::size_t>(), py::arg("bytes"))
        .def_buffer(&zp::LockedBuffer::info)
        .def_property_readonly("address", &zp::LockedBuffer::address)
        .def_property_readonly("size", &zp::LockedBuffer::size);

    py::class_<zp::AioHandle>(m, "AioHandle")
        .def(py::init<std::uint64_t, int, bool, bool, int, const std::string&, bool>(),
             py::arg("block_size"), py::arg("queue_depth"), py::arg("single_submit"),
             py::arg("overlap_events"), py::arg("intra_op_parallelism"), py::arg("backend"),
             py::arg("use_direct"))
        .def("submit", &zp::AioHandle::submit, py::arg("write"), py::arg("buffer"),
             py::arg("bytes"), py::arg("path"), py::arg("offset"))
        .def("wait", &zp::AioHandle::wait)
        .def("pending", &zp::AioHandle::pending)
        .def("is_direct", &zp::AioHandle::is_direct, py::arg("path"))
        .def("stats", &zp::AioHandle::stats)
        .def_property_readonly("backend", &zp::AioHandle::backend)
        .def_property_readonly("block_size",
                               [](const zp::AioHandle& h) { return h.aio().block_size_bytes; })
        .def_property_readonly("queue_depth",
                               [](const zp::AioHandle& h) { return h.aio().queue_depth; })
        .def_property_readonly("single_submit",
                               [](const zp::AioHandle& h) { return h.aio().single_submit; })
        .def_property_readonly("overlap_events",
                               [](const zp::AioHandle& h) { return h.aio().overlap_events; })
        .def_property_readonly("intra_op_parallelism",
                               [](const zp::AioHandle& h) { return h.aio().intra_op_parallelism; });

    py::class_<zp::NvmeOptimizer>(m, "NvmeOptimizer")
        .def(py::init<const std::vector<std::uint64_t>&, const std::string&, bool,
                      const std::vector<std::string>&, std::uint64_t, std::uint64_t, int, bool,
                      bool, int, const std::string&, bool, bool, bool, int>(),
             py::arg("group_numels"), py::arg("kind"), py::arg("amsgrad"), py::arg("nvme_paths"),
             py::arg("sub_group_size"), py::arg("block_size"), py::arg("queue_depth"),
             py::arg("single_submit"), py::arg("overlap_events"), py::arg("intra_op_parallelism"),
             py::arg("backend"), py::arg("pipeline_read"), py::arg("pipeline_write"),
             py::arg("verify_checksums"), py::arg("threads"))
        .def("initialize", &zp::NvmeOptimizer::initialize, py::arg("group"), py::arg("pieces"))
        .def("step", &zp::NvmeOptimizer::step, py::arg("group"), py::arg("pieces"), py::arg("step"),
             py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
             py::arg("weight_decay"), py::arg("bias_correction"), py::arg("grad_scale") = 1.0,
             py::arg("torch_rounding") = false)
        .def(
            "read_states",
            [](zp::NvmeOptimizer& o, std::size_t g, const py::list& t) { o.transfer(g, t, false); },
            py::arg("group"), py::arg("targets"))
        .def(
            "write_states",
            [](zp::NvmeOptimizer& o, std::size_t g, const py::list& t) { o.transfer(g, t, true); },
            py::arg("group"), py::arg("targets"))
        .def("swap_files", &zp::NvmeOptimizer::swap_files)
        .def("sub_group_count", &zp::NvmeOptimizer::sub_group_count, py::arg("group"))
        .def_property_readonly("backend", &zp::NvmeOptimizer::backend)
        .def_property_readonly("bytes_on_disk", &zp::NvmeOptimizer::bytes_on_disk);
}
