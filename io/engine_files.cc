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
                return Status::not_found(
                    str_cat("open ", path, ": directory ", parent, " does not exist"), err);
            }
            return Status::not_found(str_cat("open ", path, ": No such file or directory"), err);
        case ENOTDIR:
            return Status::invalid_argument(
                str_cat("open ", path,
                        ": a component of the path is a file where a directory is expected"));
        case EISDIR:
            return Status::invalid_argument(
                str_cat("open ", path, ": is a directory, expected a file"));
        case EROFS:
            return Status::io_error(str_cat("open ", path, ": read-only file system"), err);
        case EACCES:
            return Status::io_error(str_cat("open ", path, ": permission denied"), err);
        default:
            return Status::from_errno(err, str_cat("open ", path));
    }
}

// Engine::open's scope guard: unless kept, it removes again the files that this open created,
// in stripe order, so that a failed open leaves no file behind.
class RemoveCreatedUnlessKept {
public:
    RemoveCreatedUnlessKept(FileSystem& fs, const File& file) : fs_(fs), file_(file) {}
    RemoveCreatedUnlessKept(const RemoveCreatedUnlessKept&) = delete;
    RemoveCreatedUnlessKept& operator=(const RemoveCreatedUnlessKept&) = delete;
    ~RemoveCreatedUnlessKept() {
        if (kept_) return;
        for (const Stripe& s : file_.stripes) {
            if (s.created) (void)fs_.remove_at(s.directory, s.name, /*directory=*/false);
        }
    }
    void keep() noexcept { kept_ = true; }

private:
    FileSystem& fs_;
    const File& file_;
    bool kept_ = false;
};

Status check_open_arguments(std::span<const std::string> paths, const FileOptions& options) {
    if (paths.empty()) return Status::invalid_argument("open: no path given");
    if (options.read_only &&
        (options.create || options.truncate || options.preallocate_bytes > 0)) {
        return Status::invalid_argument(
            "open: read_only excludes create, truncate and preallocate");
    }
    return Status::ok();
}

// Opens the directory that holds the stripe's file, never through a symbolic link as its last
// component when options.trusted_directory; the file is then opened relative to it.
Status open_parent_directory(FileSystem& fs, const FileOptions& options, Stripe& s) {
    const std::string& path = s.path;
    const std::filesystem::path fs_path(path);
    s.name = fs_path.filename().string();
    if (s.name.empty() || s.name == "." || s.name == "..") {
        return Status::invalid_argument(str_cat("open ", path, ": expected a file name"));
    }
    std::string parent = fs_path.parent_path().string();
    // push_back, not `= "."`: GCC 12 at -O3 sees a false overlap in the inlined assignment
    // (-Wrestrict).
    if (parent.empty()) parent.push_back('.');
    auto directory = fs.open_directory(parent, /*follow_last=*/!options.trusted_directory);
    if (!directory.has_value()) {
        const Status& e = directory.error();
        if (e.errno_value() == ENOENT) {
            return Status::not_found(
                str_cat("open ", path, ": directory ", parent, " does not exist"), ENOENT);
        }
        if (e.errno_value() == ENOTDIR) return explain_open_error(ENOTDIR, path, options);
        return e.with_context(str_cat("open ", path));
    }
    s.directory = std::move(*directory);
    return Status::ok();
}

// Opens (or creates) the stripe's file for buffered I/O; marks it created when it did not
// exist before, so that a failed open removes it again.
Status open_buffered(FileSystem& fs, const FileOptions& options, Stripe& s) {
    int flags = options.read_only ? O_RDONLY : O_RDWR;
    if (options.create) flags |= O_CREAT;
    if (options.create && options.exclusive) flags |= O_EXCL;
    if (options.truncate) flags |= O_TRUNC;
    struct stat before {};
    const bool existed =
        ::fstatat(s.directory.fd(), s.name.c_str(), &before, AT_SYMLINK_NOFOLLOW) == 0;
    auto opened = fs.open_at(s.directory, s.name, flags, options.mode);
    if (!opened.has_value()) {
        const Status& e = opened.error();
        // A refused symbolic link or an injected fault says so itself; errno explains others.
        if (e.code() == StatusCode::kInvalidArgument || e.errno_value() == 0 || e.is_injected()) {
            return e;
        }
        return explain_open_error(e.errno_value(), s.path, options);
    }
    FileDescriptor fd = std::move(*opened);
    s.created = !existed;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        return Status::invalid_argument(str_cat("open ", s.path, ": not a regular file"));
    }
    s.buffered_fd = std::move(fd);
    s.buffered_fd_value = s.buffered_fd.get();
    return Status::ok();
}

// The stripe's file opened a second time, with O_DIRECT: `fd` when that worked, else the error
// in `refusal` (an error of its own, such as a symbolic link put in its place, is returned).
struct DirectOpen {
    FileDescriptor fd;
    Status refusal;
};

Result<DirectOpen> reopen_direct(FileSystem& fs, const FileOptions& options, const Stripe& s) {
    auto reopened =
        fs.open_at(s.directory, s.name, O_DIRECT | (options.read_only ? O_RDONLY : O_RDWR), 0);
    DirectOpen out;
    if (!reopened.has_value()) {
        const Status& e = reopened.error();
        if (e.code() == StatusCode::kInvalidArgument && e.errno_value() == ELOOP) return e;
        out.refusal = e;
        return out;
    }
    out.fd = std::move(*reopened);
    // The same file both times: nothing replaced the name between the two opens.
    struct stat a {};
    struct stat b {};
    if (::fstat(s.buffered_fd.get(), &a) != 0 || ::fstat(out.fd.get(), &b) != 0 ||
        a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        return Status::io_error(str_cat("open ", s.path,
                                        ": the file changed between its "
                                        "buffered and its O_DIRECT open"),
                                EBUSY);
    }
    return out;
}

// Takes the O_DIRECT descriptor when the file system accepts direct I/O on it, with its
// alignment (queried, not assumed). Where it refuses (EINVAL, EOPNOTSUPP, or statx says no),
// `mode` decides: kAuto falls back to buffered I/O with one warning per directory, kOn fails.
Status adopt_direct_or_fall_back(DirectMode mode, DirectOpen direct, Stripe& s) {
    const std::string& path = s.path;
    const int err = direct.refusal.errno_value();
    Result<DirectIoAlignment> alignment = DirectIoAlignment{};
    if (direct.fd.valid()) alignment = query_direct_io_alignment(direct.fd.get(), path);
    if (!alignment.has_value()) return alignment.error();
    if (direct.fd.valid() && alignment->direct_supported) {
        s.direct_fd = std::move(direct.fd);
        s.direct_fd_value = s.direct_fd.get();
        s.alignment_bytes = alignment->alignment_bytes;
        log::debug("io: ", path, ": O_DIRECT alignment ", s.alignment_bytes, " bytes (",
                   alignment->source, ")");
        return Status::ok();
    }
    if (!direct.fd.valid() && err != EINVAL && err != EOPNOTSUPP) {
        return direct.refusal.with_context("O_DIRECT");
    }
    if (mode == DirectMode::kOn) {
        return Status::not_supported(
            str_cat("open ", path, ": the file system refuses O_DIRECT",
                    err != 0 ? str_cat(" (", std::strerror(err), ")") : std::string(),
                    " and aio.use_direct is true; set it to \"auto\" or false"),
            err);
    }
    log::warn_once(str_cat("io-no-direct:", std::filesystem::path(path).parent_path().string()),
                   str_cat("io: ", path,
                           ": the file system refuses O_DIRECT; using buffered I/O "
                           "(aio.use_direct is auto)"));
    return Status::ok();
}

// Opens one stripe of a logical file: on the simulated device, or as a file of the file system,
// buffered and (unless aio.use_direct is off) a second time with O_DIRECT.
Status open_stripe(SimDevice* sim, FileSystem& fs, DirectMode use_direct,
                   const FileOptions& options, Stripe& s) {
    const bool want_direct = use_direct != DirectMode::kOff;
    if (sim != nullptr) {
        auto id = sim->open(s.path, options);
        if (!id.has_value()) return id.error();
        s.sim_id = *id;
        s.buffered_fd_value = s.direct_fd_value = *id;
        s.alignment_bytes = want_direct ? sim->options().logical_block_bytes : 1;
        return Status::ok();
    }
    ZINF_TRY(open_parent_directory(fs, options, s));
    ZINF_TRY(open_buffered(fs, options, s));
    if (!want_direct) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(DirectOpen direct, reopen_direct(fs, options, s));
    return adopt_direct_or_fall_back(use_direct, std::move(direct), s);
}

// Makes the file direct only when every stripe takes O_DIRECT, so that one alignment rule (the
// largest over its stripes) covers it, and checks aio.block_size and the stripe chunk against
// that alignment. A file that is not direct keeps only its buffered descriptors.
Status settle_direct_io(const AioOptions& aio, bool sim, File& file) {
    const bool want_direct = aio.use_direct != DirectMode::kOff;
    file.direct =
        want_direct && std::all_of(file.stripes.begin(), file.stripes.end(),
                                   [&](const Stripe& s) { return sim || s.direct_fd.valid(); });
    file.alignment_bytes = 1;
    if (file.direct) {
        for (const Stripe& s : file.stripes) {
            file.alignment_bytes = std::max(file.alignment_bytes, s.alignment_bytes);
        }
        if (aio.block_size_bytes % file.alignment_bytes != 0) {
            return Status::invalid_argument(
                str_cat("aio.block_size: ", aio.block_size_bytes,
                        " bytes is not a multiple of the logical block size of ",
                        file.stripes[0].path, " (", file.alignment_bytes, " bytes)"));
        }
    } else {
        for (Stripe& s : file.stripes) {
            s.direct_fd.reset();
            s.direct_fd_value = s.buffered_fd_value;
            s.alignment_bytes = 1;
        }
    }
    if (file.stripes.size() > 1 &&
        (file.chunk_bytes == 0 || file.chunk_bytes % file.alignment_bytes != 0)) {
        return Status::invalid_argument(str_cat("open: stripe_chunk_bytes ", file.chunk_bytes,
                                                " is not a multiple of the logical block size (",
                                                file.alignment_bytes, " bytes)"));
    }
    return Status::ok();
}

// Reserves one stripe's share of a preallocation on the file system: kNoSpace up front when the
// file system has too little free space, else fallocate through `fs`.
Status preallocate_on_file_system(FileSystem& fs, const Stripe& s, std::uint64_t share_bytes) {
    struct stat st {};
    if (::fstat(s.buffered_fd.get(), &st) != 0) {
        return Status::from_errno(errno, str_cat("fstat ", s.path));
    }
    const auto have = static_cast<std::uint64_t>(st.st_blocks) * 512;
    if (share_bytes <= have) return Status::ok();
    const std::string dir = std::filesystem::path(s.path).parent_path().string();
    auto free = free_space_bytes(dir.empty() ? "." : dir);
    if (free.has_value() && share_bytes - have > *free) {
        return Status::no_space(str_cat("preallocate ", s.path, ": ", share_bytes, " bytes asked, ",
                                        *free, " bytes free on its file system"));
    }
    return fs.preallocate(s.buffered_fd.get(), share_bytes, s.path);
}

// Reserves options.preallocate_bytes of the logical file, each stripe its share.
Status preallocate_stripes(SimDevice* sim, FileSystem& fs, File& file,
                           std::uint64_t preallocate_bytes) {
    if (preallocate_bytes == 0) return Status::ok();
    const auto count = static_cast<std::uint64_t>(file.stripes.size());
    for (std::uint64_t i = 0; i < count; ++i) {
        Stripe& s = file.stripes[i];
        const std::uint64_t share =
            stripe_share_bytes(preallocate_bytes, file.chunk_bytes, count, i);
        if (sim != nullptr) {
            Status st = sim->reserve(s.sim_id, share);
            if (!st.is_ok()) return st.with_context(str_cat("preallocate ", s.path));
            continue;
        }
        ZINF_TRY(preallocate_on_file_system(fs, s, share));
    }
    return Status::ok();
}

}  // namespace

// Hands out the file's id and fixed-file slots, registers the slots with every worker's backend
// and adds the file to the table.
FileId Engine::Impl::add_file(std::unique_ptr<File> file) {
    FileId id = 0;
    {
        std::lock_guard lock(mutex);
        id = static_cast<FileId>(files.size());
        file->id = id;
        if (sim == nullptr && aio.register_buffers) {
            for (Stripe& s : file->stripes) {
                s.buffered_slot = allocate_slot_locked();
                if (s.direct_fd.valid()) s.direct_slot = allocate_slot_locked();
            }
        }
    }
    File* raw = file.get();
    Status reg = run_on_workers([raw](EngineWorker& w) -> Status {
        for (const Stripe& s : raw->stripes) {
            if (s.buffered_slot >= 0) {
                ZINF_TRY(w.backend().register_file(s.buffered_slot, s.buffered_fd_value));
            }
            if (s.direct_slot >= 0) {
                ZINF_TRY(w.backend().register_file(s.direct_slot, s.direct_fd_value));
            }
        }
        return Status::ok();
    });
    if (!reg.is_ok()) {
        // Plain descriptors still work; the slots just go unused.
        log::warn_once("io-fixed-files", str_cat("io: registering files failed (", reg.to_string(),
                                                 "); using plain descriptors"));
    }
    std::lock_guard lock(mutex);
    files.push_back(std::move(file));
    return id;
}

Result<FileId> Engine::open(std::span<const std::string> paths, const FileOptions& options) {
    Impl& impl = *impl_;
    ZINF_TRY(check_open_arguments(paths, options));
    auto file = std::make_unique<File>();
    file->read_only = options.read_only;
    file->chunk_bytes =
        options.stripe_chunk_bytes != 0 ? options.stripe_chunk_bytes : impl.aio.block_size_bytes;
    FileSystem& fs = file_system();
    RemoveCreatedUnlessKept guard(fs, *file);
    for (const std::string& path : paths) {
        if (path.empty()) return Status::invalid_argument("open: empty path");
        // The stripe joins the file at once, so that the guard finds it whatever fails below.
        Stripe& s = file->stripes.emplace_back();
        s.path = path;
        ZINF_TRY(open_stripe(impl.sim.get(), fs, impl.aio.use_direct, options, s));
    }
    ZINF_TRY(settle_direct_io(impl.aio, impl.sim != nullptr, *file));
    ZINF_TRY(preallocate_stripes(impl.sim.get(), fs, *file, options.preallocate_bytes));
    guard.keep();
    return impl.add_file(std::move(file));
}

Status Engine::close(FileId id) {
    Impl& impl = *impl_;
    File* file = nullptr;
    {
        std::lock_guard lock(impl.mutex);
        file = impl.file_locked(id);
        if (file == nullptr) {
            return Status::invalid_argument(str_cat("close: unknown file id ", id));
        }
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
            for (int slot : {s.buffered_slot, s.direct_slot}) {
                if (slot >= 0) impl.fixed_slot_used[static_cast<std::size_t>(slot)] = false;
            }
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
