// io::Storage: where an io::Engine's files live and what moves their bytes. The engine opens,
// preallocates, syncs and removes its files through it, has it make each worker's backend, and
// asks it whether those backends take registered buffers and files; it knows no kind of storage.
// The operating system's storage (files opened through an io::FileSystem, moved by io_uring,
// libaio or posix as aio.backend says) is the default; the simulated device (io/sim_storage.h)
// is another, passed in through EngineOptions as the faulty file system is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/backend.h"
#include "io/engine.h"
#include "io/file_system.h"
#include "src/base/file.h"
#include "src/base/status.h"

namespace zinf::io {

// One file of a storage as the engine addresses it: one stripe of a logical file. Storage::open
// fills it; the engine owns it until it closes the file, which closes the descriptors.
struct StorageFile {
    std::string path;  // as the caller named it; errors name it
    // Where a storage of the file system opened the file, and the descriptors it owns; empty
    // when the storage's files are not the operating system's.
    Directory directory;
    std::string name;  // the file's name in `directory`
    FileDescriptor buffered_fd;
    FileDescriptor direct_fd;  // valid when the file is open with O_DIRECT
    // What pieces carry in Request::fd: a descriptor, or a handle that the storage's own
    // backends understand.
    int buffered_fd_value = -1;
    int direct_fd_value = -1;
    // Direct I/O accepted: pieces aligned to alignment_bytes may go through direct_fd_value.
    bool direct = false;
    std::size_t alignment_bytes = 1;  // of direct I/O on this file; 1 without it
    bool created = false;  // the open made the file: if the engine's open fails, it is removed
};

// Thread-safe: an engine opens files from any caller's thread and makes each worker's backend on
// that worker's thread.
class Storage {
public:
    virtual ~Storage() = default;

    // Makes the backend of engine worker `worker_index` (0-based), on that worker's thread (an
    // io_uring ring with SINGLE_ISSUER must be set up by the thread that submits).
    // options.kind is aio.backend for the first worker and, for the others, the name of the
    // backend the first one got. Errors say why no backend could be made (kNotSupported for a
    // backend that cannot be set up here).
    virtual Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options,
                                                          std::size_t worker_index) = 0;
    // Whether the backends it makes may take registered (fixed) buffers and files. When false,
    // the engine hands out no fixed-file slots and Engine::register_buffers does nothing.
    virtual bool registers_buffers() const noexcept = 0;

    // Opens (or, as `options` say, creates) the file at file.path and fills `file`. Unless
    // `direct` is kOff it also sets up direct I/O where the storage accepts it on the file; where
    // it does not, kOn makes that an error and kAuto leaves the file buffered. On error `file`
    // holds what was done so far, `created` included. Errors name the path.
    virtual Status open(const FileOptions& options, DirectMode direct, StorageFile& file) = 0;
    // Reserves [0, length_bytes) of an open file, so that a full device is met here and not in
    // the middle of training (kNoSpace).
    virtual Status preallocate(StorageFile& file, std::uint64_t length_bytes) = 0;
    // Makes what was written to the file durable (fdatasync).
    virtual Status sync(const StorageFile& file) = 0;
    // Removes a file that an open created (file.created), after that open failed.
    virtual Status remove(const StorageFile& file) = 0;
};

// The storage that an engine made with `options` owns: the simulated device for options.sim,
// else the operating system's (through options.file_system, or posix_file_system()). None when
// options.storage is set, which the engine then uses instead. Errors: kInvalidArgument for both
// options.storage and options.sim, or for simulated-device options that contradict themselves.
Result<std::unique_ptr<Storage>> make_storage(const EngineOptions& options);

// The operating system's storage: files opened through `file_system` (borrowed; must outlive
// the storage), direct where the file system takes O_DIRECT, moved by the backend that
// BackendOptions::kind names ("auto": io_uring, libaio, then posix, the first that can be set
// up, logged with why it passed over the others). `aio_backend` is what the config asked for:
// a backend named there that cannot be set up is kNotSupported naming the key.
std::unique_ptr<Storage> make_os_storage(FileSystem& file_system, std::string aio_backend);

}  // namespace zinf::io
