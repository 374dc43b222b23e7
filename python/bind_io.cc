// zinfinity._C's I/O: page-aligned locked buffers and DeepSpeed's aio_handle over io::Engine.
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
#include "python/binding.h"
#include "src/base/aligned.h"
#include "src/base/log.h"

namespace zinf::python {
namespace {

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

    // Starts a transfer and returns 0 without waiting; or, where the file takes O_DIRECT and
    // the buffer does not start on its alignment, starts nothing and returns that alignment
    // (the caller bounces the bytes through aligned memory). Raises before anything starts on
    // a bad path or a read past the end of the file.
    std::size_t submit(bool write, std::uintptr_t buffer, std::uint64_t bytes,
                       const std::string& path, std::uint64_t offset) {
        auto op = std::make_unique<Op>();
        op->path = path;
        op->offset = offset;
        op->write = write;
        op->bytes = bytes;
        Status status;
        std::size_t misaligned = 0;
        {
            py::gil_scoped_release release;
            status = start(*op, buffer, misaligned);
        }
        check(status);
        if (misaligned != 0) return misaligned;
        ops_.push_back(std::move(op));
        return 0;
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

    // Opens the file and starts the transfer; `misaligned` receives the file's O_DIRECT
    // alignment instead when the buffer misses it (the file is closed again, nothing started).
    Status start(Op& op, std::uintptr_t buffer, std::size_t& misaligned) {
        if (op.bytes == 0) return Status::invalid_argument(str_cat(op.path, ": an empty tensor"));
        io::FileOptions fo;
        fo.create = op.write;
        fo.read_only = !op.write;
        ZINF_ASSIGN_OR_RETURN(const io::FileId file, engine_->open(op.path, fo));
        op.file = file;
        const std::size_t align = engine_->alignment_bytes(file);
        Status status;
        if (engine_->is_direct(file) && buffer % align != 0) {
            misaligned = align;
        } else {
            status = check_size(op);
            if (status.is_ok()) {
                auto* data = address<std::byte>(buffer);
                status = op.write
                             ? engine_->submit_write(op.handle, file, op.offset, {data, op.bytes})
                             : engine_->submit_read(op.handle, file, op.offset, {data, op.bytes});
            }
        }
        if (!status.is_ok() || misaligned != 0) {
            (void)engine_->close(file);
            op.file.reset();
            return status;
        }
        op.started = true;
        return Status::ok();
    }

    // A read must end within the file.
    static Status check_size(const Op& op) {
        if (op.write) return Status::ok();
        struct stat st {};
        if (::stat(op.path.c_str(), &st) == 0 &&
            static_cast<std::uint64_t>(st.st_size) < op.offset + op.bytes) {
            return Status::invalid_argument(
                str_cat(op.path, ": reading ", op.bytes, " bytes at offset ", op.offset, " needs ",
                        op.offset + op.bytes, " bytes; the file has ", st.st_size));
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

}  // namespace

void bind_io(py::module_& m) {
    py::class_<LockedBuffer>(m, "LockedBuffer", py::buffer_protocol())
        .def(py::init<std::size_t>(), py::arg("bytes"))
        .def_buffer(&LockedBuffer::info)
        .def_property_readonly("address", &LockedBuffer::address)
        .def_property_readonly("size", &LockedBuffer::size);

    py::class_<AioHandle>(m, "AioHandle")
        .def(py::init<std::uint64_t, int, bool, bool, int, const std::string&, bool>(),
             py::arg("block_size"), py::arg("queue_depth"), py::arg("single_submit"),
             py::arg("overlap_events"), py::arg("intra_op_parallelism"), py::arg("backend"),
             py::arg("use_direct"))
        .def("submit", &AioHandle::submit, py::arg("write"), py::arg("buffer"), py::arg("bytes"),
             py::arg("path"), py::arg("offset"))
        .def("wait", &AioHandle::wait)
        .def("pending", &AioHandle::pending)
        .def("is_direct", &AioHandle::is_direct, py::arg("path"))
        .def("stats", &AioHandle::stats)
        .def_property_readonly("backend", &AioHandle::backend)
        .def_property_readonly("block_size",
                               [](const AioHandle& h) { return h.aio().block_size_bytes; })
        .def_property_readonly("queue_depth",
                               [](const AioHandle& h) { return h.aio().queue_depth; })
        .def_property_readonly("single_submit",
                               [](const AioHandle& h) { return h.aio().single_submit; })
        .def_property_readonly("overlap_events",
                               [](const AioHandle& h) { return h.aio().overlap_events; })
        .def_property_readonly("intra_op_parallelism",
                               [](const AioHandle& h) { return h.aio().intra_op_parallelism; });
}

}  // namespace zinf::python
