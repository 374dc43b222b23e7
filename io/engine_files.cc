// io::Engine's file table: open (the stripes, O_DIRECT where the file system takes it with a
// buffered fallback, alignment checks, preallocation, fixed-file slots), close and sync.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/block_size.h"
#include "io/detail/engine_impl.h"
#include "io/engine.h"
#include "io/sim_backend.h"
#include "src/base/log.h"

namespace zinf::io {

using detail::File;
using detail::Stripe;

namespace {

// The bytes stripe `index` holds of a logical file of `size` bytes.
std::uint64_t stripe_share_bytes(std::uint64_t size, std::uint64_t chunk, std::uint64_t count,
                                 std::uint64_t index) {
    if (count == 1) return size;
    const std::uint64_t round = chunk * count;
    const std::uint64_t full = size / round * chunk;
    const std::uint64_t rest = size % round;
    const std::uint64_t start = index * chunk;
    return full + (rest > start ? std::min(chunk, rest - start) : 0);
}

Status explain_open_error(int err, const std::string& path, const FileOptions& options) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    switch (err) {
        case ENOENT:
            if (options.create && !parent.empty() && ::access(parent.c_str(), F_OK) != 0) {
                return Status::not_found(str_cat("open ", path, ": directory ", parent, " does not exist"), err);
            }
            return Status::not_found(str_cat("open ", path, ": No such file or directory"), err);
        case ENOTDIR:
            return Status::invalid_argument(str_cat(
                "open ", path, ": a component of the path is a file where a directory is expected"));
        case EISDIR:
            return Status::invalid_argument(str_cat("open ", path, ": is a directory, expected a file"));
        case EROFS:
            return Status::io_error(str_cat("open ", path, ": read-only file system"), err);
        case EACCES:
            return Status::io_error(str_cat("open ", path, ": permission denied"), err);
        default:
            return Status::from_errno(err, str_cat("open ", path));
    }
}

}  // namespace

Result<FileId> Engine::open(std::span<const std::string> paths, const FileOptions& options) {
    Impl& impl = *impl_;
    if (paths.empty()) return Status::invalid_argument("open: no path given");
    if (options.read_only && (options.create || options.truncate || options.preallocate_bytes > 0)) {
        return Status::invalid_argument("open: read_only excludes create, truncate and preallocate");
    }
    auto file = std::make_unique<File>();
    file->read_only = options.read_only;
    file->chunk_bytes = options.stripe_chunk_bytes != 0 ? options.stripe_chunk_bytes : impl.aio.block_size_bytes;
    const bool want_direct = impl.aio.use_direct != DirectMode::kOff;
    FileSystem& fs = file_system();
    // Files this call created, removed again if open fails: (stripe index, name).
    std::vector<std::size_t> created;
    auto cleanup = [&] {
        for (std::size_t i : created) {
            const Stripe& c = file->stripes[i];
            (void)fs.remove_at(c.directory, c.name, /*directory=*/false);
        }
    };

    for (const std::string& path : paths) {
        if (path.empty()) {
            cleanup();
            return Status::invalid_argument("open: empty path");
        }
        // The stripe joins the file at once, so that cleanup() finds it whatever fails below.
        Stripe& s = file->stripes.emplace_back();
        s.path = path;
        if (impl.sim) {
            auto id = impl.sim->open(path, options);
            if (!id.has_value()) return id.error();
            s.sim_id = *id;
            s.buffered_fd_value = s.direct_fd_value = *id;
            s.alignment_bytes = want_direct ? impl.sim->options().logical_block_bytes : 1;
            continue;
        }
        const std::filesystem::path fs_path(path);
        s.name = fs_path.filename().string();
        if (s.name.empty() || s.name == "." || s.name == "..") {
            cleanup();
            return Status::invalid_argument(str_cat("open ", path, ": expected a file name"));
        }
        std::string parent = fs_path.parent_path().string();
        if (parent.empty()) parent = ".";
        auto directory = fs.open_directory(parent, /*follow_last=*/!options.trusted_directory);
        if (!directory.has_value()) {
            cleanup();
            const Status& e = directory.error();
            if (e.errno_value() == ENOENT) {
                return Status::not_found(str_cat("open ", path, ": directory ", parent,
                                                 " does not exist"), ENOENT);
            }
            if (e.errno_value() == ENOTDIR) return explain_open_error(ENOTDIR, path, options);
            return e.with_context(str_cat("open ", path));
        }
        s.directory = std::move(*directory);
        int flags = options.read_only ? O_RDONLY : O_RDWR;
        if (options.create) flags |= O_CREAT;
        if (options.create && options.exclusive) flags |= O_EXCL;
        if (options.truncate) flags |= O_TRUNC;
        struct stat before {};
        const bool existed =
            ::fstatat(s.directory.fd(), s.name.c_str(), &before, AT_SYMLINK_NOFOLLOW) == 0;
        auto opened = fs.open_at(s.directory, s.name, flags, options.mode);
        if (!opened.has_value()) {
            cleanup();
            const Status& e = opened.error();
            // A refused symbolic link or an injected fault says so itself; errno explains others.
            if (e.code() == StatusCode::kInvalidArgument || e.errno_value() == 0 ||
                e.is_injected()) {
                return e;
            }
            return explain_open_error(e.errno_value(), path, options);
        }
        FileDescriptor fd = std::move(*opened);
        if (!existed) created.push_back(file->stripes.size() - 1);
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
            cleanup();
            return Status::invalid_argument(str_cat("open ", path, ": not a regular file"));
        }
        s.buffered_fd = std::move(fd);
        s.buffered_fd_value = s.buffered_fd.get();
        if (want_direct) {
            auto reopened = fs.open_at(s.directory, s.name,
                                       O_DIRECT | (options.read_only ? O_RDONLY : O_RDWR), 0);
            FileDescriptor direct;
            int err = 0;
            Status reopen_error;
            if (reopened.has_value()) {
                direct = std::move(*reopened);
                // The same file both times: nothing replaced the name between the two opens.
                struct stat a {}, b {};
                if (::fstat(s.buffered_fd.get(), &a) != 0 || ::fstat(direct.get(), &b) != 0 ||
                    a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
                    cleanup();
                    return Status::io_error(str_cat("open ", path, ": the file changed between "
                                                    "its buffered and its O_DIRECT open"), EBUSY);
                }
            } else {
                err = reopened.error().errno_value();
                reopen_error = reopened.error();
                if (reopened.error().code() == StatusCode::kInvalidArgument && err == ELOOP) {
                    cleanup();
                    return reopened.error();
                }
            }
            Result<DirectIoAlignment> alignment = DirectIoAlignment{};
            if (direct.valid()) alignment = query_direct_io_alignment(direct.get(), path);
            if (!alignment.has_value()) {
                cleanup();
                return alignment.error();
            }
            const bool refused = !direct.valid() || !alignment->direct_supported;
            if (refused) {
                if (direct.valid() || err == EINVAL || err == EOPNOTSUPP) {
                    if (impl.aio.use_direct == DirectMode::kOn) {
                        cleanup();
                        return Status::not_supported(
                            str_cat("open ", path, ": the file system refuses O_DIRECT",
                                    err != 0 ? str_cat(" (", std::strerror(err), ")") : std::string(),
                                    " and aio.use_direct is true; set it to \"auto\" or false"),
                            err);
                    }
                    log::warn_once(str_cat("io-no-direct:", std::filesystem::path(path).parent_path().string()),
                                   str_cat("io: ", path, ": the file system refuses O_DIRECT; using "
                                           "buffered I/O (aio.use_direct is auto)"));
                } else {
                    cleanup();
                    return reopen_error.with_context("O_DIRECT");
                }
            } else {
                s.direct_fd = std::move(direct);
                s.direct_fd_value = s.direct_fd.get();
                s.alignment_bytes = alignment->alignment_bytes;
                log::debug("io: ", path, ": O_DIRECT alignment ", s.alignment_bytes, " bytes (",
                           alignment->source, ")");
            }
        }
    }

    // Direct only when every stripe takes it, so that one alignment rule covers the file.
    file->direct = want_direct && std::all_of(file->stripes.begin(), file->stripes.end(), [&](const Stripe& s) {
                       return impl.sim != nullptr || s.direct_fd.valid();
                   });
    file->alignment_bytes = 1;
    if (file->direct) {
        for (const Stripe& s : file->stripes) file->alignment_bytes = std::max(file->alignment_bytes, s.alignment_bytes);
        if (impl.aio.block_size_bytes % file->alignment_bytes != 0) {
            cleanup();
            return Status::invalid_argument(str_cat(
                "aio.block_size: ", impl.aio.block_size_bytes, " bytes is not a multiple of the "
                "logical block size of ", file->stripes[0].path, " (", file->alignment_bytes, " bytes)"));
        }
    } else {
        for (Stripe& s : file->stripes) {
            s.direct_fd.reset();
            s.direct_fd_value = s.buffered_fd_value;
            s.alignment_bytes = 1;
        }
    }
    if (file->stripes.size() > 1 && (file->chunk_bytes == 0 || file->chunk_bytes % file->alignment_bytes != 0)) {
        cleanup();
        return Status::invalid_argument(str_cat("open: stripe_chunk_bytes ", file->chunk_bytes,
                                                " is not a multiple of the logical block size (",
                                                file->alignment_bytes, " bytes)"));
    }

    if (options.preallocate_bytes > 0) {
        const auto count = static_cast<std::uint64_t>(file->stripes.size());
        for (std::uint64_t i = 0; i < count; ++i) {
            Stripe& s = file->stripes[i];
            const std::uint64_t share = stripe_share_bytes(options.preallocate_bytes, file->chunk_bytes, count, i);
            if (impl.sim) {
                Status st = impl.sim->reserve(s.sim_id, share);
                if (!st.is_ok()) return st.with_context(str_cat("preallocate ", s.path));
                continue;
            }
            struct stat st {};
            if (::fstat(s.buffered_fd.get(), &st) != 0) {
                cleanup();
                return Status::from_errno(errno, str_cat("fstat ", s.path));
            }
            const auto have = static_cast<std::uint64_t>(st.st_blocks) * 512;
            if (share > have) {
                const std::string dir = std::filesystem::path(s.path).parent_path().string();
                auto free = free_space_bytes(dir.empty() ? "." : dir);
                if (free.has_value() && share - have > *free) {
                    cleanup();
                    return Status::no_space(str_cat("preallocate ", s.path, ": ", share,
                                                    " bytes asked, ", *free, " bytes free on its file system"));
                }
                Status reserved = fs.preallocate(s.buffered_fd.get(), share, s.path);
                if (!reserved.is_ok()) {
                    cleanup();
                    return reserved;
                }
            }
        }
    }

    // Hand out fixed-file slots and register them with every worker's backend.
    FileId id = 0;
    {
        std::lock_guard lock(impl.mutex);
        id = static_cast<FileId>(impl.files.size());
        file->id = id;
        if (impl.sim == nullptr && impl.aio.register_buffers) {
            for (Stripe& s : file->stripes) {
                s.buffered_slot = impl.allocate_slot_locked();
                if (s.direct_fd.valid()) s.direct_slot = impl.allocate_slot_locked();
            }
        }
    }
    File* raw = file.get();
    Status reg = impl.run_on_workers([raw](EngineWorker& w) -> Status {
        for (const Stripe& s : raw->stripes) {
            if (s.buffered_slot >= 0) ZINF_TRY(w.backend().register_file(s.buffered_slot, s.buffered_fd_value));
            if (s.direct_slot >= 0) ZINF_TRY(w.backend().register_file(s.direct_slot, s.direct_fd_value));
        }
        return Status::ok();
    });
    if (!reg.is_ok()) {
        // Plain descriptors still work; the slots just go unused.
        log::warn_once("io-fixed-files", str_cat("io: registering files failed (", reg.to_string(),
                                                 "); using plain descriptors"));
    }
    std::lock_guard lock(impl.mutex);
    impl.files.push_back(std::move(file));
    return id;
}

Status Engine::close(FileId id) {
    Impl& impl = *impl_;
    File* file = nullptr;
    {
        std::lock_guard lock(impl.mutex);
        file = impl.file_locked(id);
        if (file == nullptr) return Status::invalid_argument(str_cat("close: unknown file id ", id));
        ZINF_ASSERT_MSG(file->ops_in_flight.load(std::memory_order_acquire) == 0,
                        "Engine::close with operations in flight on the file");
    }
    Status unreg = impl.run_on_workers([file](EngineWorker& w) -> Status {
        Status first;
        for (const Stripe& s : file->stripes) {
            for (int slot : {s.buffered_slot, s.direct_slot}) {
                if (slot < 0) continue;
                Status st = w.backend().register_file(slot, -1);
                if (first.is_ok() && !st.is_ok()) first = std::move(st);
            }
        }
        return first;
    });
    std::unique_ptr<File> owned;
    {
        std::lock_guard lock(impl.mutex);
        for (const Stripe& s : file->stripes) {
            if (s.buffered_slot >= 0) impl.fixed_slot_used[static_cast<std::size_t>(s.buffered_slot)] = false;
            if (s.direct_slot >= 0) impl.fixed_slot_used[static_cast<std::size_t>(s.direct_slot)] = false;
        }
        owned = std::move(impl.files[id]);
    }
    if (!unreg.is_ok()) log::warning("io: close: ", unreg.to_string());
    return Status::ok();  // descriptors close with `owned`
}

bool Engine::is_direct(FileId id) const {
    std::lock_guard lock(impl_->mutex);
    const File* f = impl_->file_locked(id);
    return f != nullptr && f->direct;
}

std::size_t Engine::alignment_bytes(FileId id) const {
    std::lock_guard lock(impl_->mutex);
    const File* f = impl_->file_locked(id);
    return f == nullptr ? 1 : f->alignment_bytes;
}

Status Engine::sync(FileId id) {
    File* f = nullptr;
    {
        std::lock_guard lock(impl_->mutex);
        f = impl_->file_locked(id);
    }
    if (f == nullptr) return Status::invalid_argument(str_cat("sync: unknown file id ", id));
    if (impl_->sim) return Status::ok();
    for (const Stripe& s : f->stripes) {
        ZINF_TRY(file_system().sync(s.buffered_fd.get(), /*data_only=*/true, s.path));
    }
    return Status::ok();
}

}  // namespace zinf::io
