// io::Engine's file table: open (each stripe through the storage, then the one direct-I/O rule
// and alignment of the logical file, preallocation, fixed-file slots), close and sync.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/detail/engine_impl.h"
#include "io/engine.h"
#include "io/storage.h"
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

// Engine::open's scope guard: unless kept, it removes again the files that this open created,
// in stripe order, so that a failed open leaves no file behind.
class RemoveCreatedUnlessKept {
public:
    RemoveCreatedUnlessKept(Storage& storage, const File& file) : storage_(storage), file_(file) {}
    RemoveCreatedUnlessKept(const RemoveCreatedUnlessKept&) = delete;
    RemoveCreatedUnlessKept& operator=(const RemoveCreatedUnlessKept&) = delete;
    ~RemoveCreatedUnlessKept() {
        if (kept_) return;
        for (const Stripe& s : file_.stripes) {
            if (s.created) (void)storage_.remove(s);
        }
    }
    void keep() noexcept { kept_ = true; }

private:
    Storage& storage_;
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

// Makes the file direct only when every stripe takes O_DIRECT, so that one alignment rule (the
// largest over its stripes) covers it, and checks aio.block_size and the stripe chunk against
// that alignment. A file that is not direct keeps only its buffered descriptors.
Status settle_direct_io(const AioOptions& aio, File& file) {
    const bool want_direct = aio.use_direct != DirectMode::kOff;
    file.direct = want_direct && std::all_of(file.stripes.begin(), file.stripes.end(),
                                             [](const Stripe& s) { return s.direct; });
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
            s.direct = false;
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

// Reserves options.preallocate_bytes of the logical file, each stripe its share.
Status preallocate_stripes(Storage& storage, File& file, std::uint64_t preallocate_bytes) {
    if (preallocate_bytes == 0) return Status::ok();
    const auto count = static_cast<std::uint64_t>(file.stripes.size());
    for (std::uint64_t i = 0; i < count; ++i) {
        Stripe& s = file.stripes[i];
        const std::uint64_t share =
            stripe_share_bytes(preallocate_bytes, file.chunk_bytes, count, i);
        ZINF_TRY(storage.preallocate(s, share));
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
        if (storage->registers_buffers() && aio.register_buffers) {
            for (Stripe& s : file->stripes) {
                s.buffered_slot = allocate_slot_locked();
                if (s.direct) s.direct_slot = allocate_slot_locked();
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
    RemoveCreatedUnlessKept guard(*impl.storage, *file);
    for (const std::string& path : paths) {
        if (path.empty()) return Status::invalid_argument("open: empty path");
        // The stripe joins the file at once, so that the guard finds it whatever fails below.
        Stripe& s = file->stripes.emplace_back();
        s.path = path;
        ZINF_TRY(impl.storage->open(options, impl.aio.use_direct, s));
    }
    ZINF_TRY(settle_direct_io(impl.aio, *file));
    ZINF_TRY(preallocate_stripes(*impl.storage, *file, options.preallocate_bytes));
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
    for (const Stripe& s : f->stripes) ZINF_TRY(impl_->storage->sync(s));
    return Status::ok();
}

}  // namespace zinf::io
