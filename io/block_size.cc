// Direct-I/O alignment query: statx(STATX_DIOALIGN) → tmpfs → sysfs logical_block_size → probe.
#include "io/block_size.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "src/base/aligned.h"
#include "src/base/file.h"
#include "src/base/log.h"

namespace zinf::io {
namespace {

// glibc 2.36 lacks STATX_DIOALIGN and the stx_dio_* fields (Linux 6.1); this mirrors the
// kernel's struct statx (256 bytes) so that the raw syscall can fill them.
constexpr unsigned kStatxDioAlign = 0x2000U;
struct KernelStatxTimestamp {
    std::int64_t tv_sec;
    std::uint32_t tv_nsec;
    std::int32_t reserved;
};
struct KernelStatx {
    std::uint32_t stx_mask;
    std::uint32_t stx_blksize;
    std::uint64_t stx_attributes;
    std::uint32_t stx_nlink;
    std::uint32_t stx_uid;
    std::uint32_t stx_gid;
    std::uint16_t stx_mode;
    std::uint16_t spare0;
    std::uint64_t stx_ino;
    std::uint64_t stx_size;
    std::uint64_t stx_blocks;
    std::uint64_t stx_attributes_mask;
    KernelStatxTimestamp stx_atime, stx_btime, stx_ctime, stx_mtime;
    std::uint32_t stx_rdev_major;
    std::uint32_t stx_rdev_minor;
    std::uint32_t stx_dev_major;
    std::uint32_t stx_dev_minor;
    std::uint64_t stx_mnt_id;
    std::uint32_t stx_dio_mem_align;
    std::uint32_t stx_dio_offset_align;
    std::uint64_t spare3[12];
};
static_assert(sizeof(KernelStatx) == 256);
static_assert(offsetof(KernelStatx, stx_dio_mem_align) == 0x98);

bool is_power_of_two(std::size_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

bool read_size_file(const std::string& file, std::size_t& out) {
    std::FILE* f = std::fopen(file.c_str(), "re");
    if (f == nullptr) return false;
    unsigned long value = 0;
    const bool ok = std::fscanf(f, "%lu", &value) == 1;
    std::fclose(f);
    if (!ok || !is_power_of_two(value) || value < 512 || value > 65536) return false;
    out = value;
    return true;
}

}  // namespace

Result<DirectIoAlignment> query_direct_io_alignment(int fd, const std::string& path) {
    KernelStatx stx{};
    const long rc = ::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, kStatxDioAlign, &stx);
    if (rc == 0 && (stx.stx_mask & kStatxDioAlign) != 0) {
        DirectIoAlignment a;
        a.source = "statx";
        if (stx.stx_dio_offset_align == 0) {
            a.direct_supported = false;
            return a;
        }
        a.alignment_bytes = std::max<std::size_t>(stx.stx_dio_mem_align, stx.stx_dio_offset_align);
        if (!is_power_of_two(a.alignment_bytes)) {
            return Status::internal(str_cat(path, ": statx reports a direct-I/O alignment of ",
                                            a.alignment_bytes, ", not a power of two"));
        }
        return a;
    }

    // tmpfs takes O_DIRECT since Linux 6.6 (before, the O_DIRECT open itself fails and no
    // descriptor reaches this query) and serves it from its page cache, so it needs no
    // alignment at all; it reports none through statx, and it has no block device to ask.
    struct statfs fs {};
    if (::fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
        DirectIoAlignment a;
        a.alignment_bytes = 1;
        a.source = "tmpfs";
        return a;
    }

    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::from_errno(errno, str_cat("fstat ", path));
    const std::string dev = str_cat("/sys/dev/block/", major(st.st_dev), ":", minor(st.st_dev));
    std::size_t lbs = 0;
    // A partition's queue/ lives in its parent disk's directory.
    if (read_size_file(dev + "/queue/logical_block_size", lbs) ||
        read_size_file(dev + "/../queue/logical_block_size", lbs)) {
        DirectIoAlignment a;
        a.alignment_bytes = lbs;
        a.source = "sysfs";
        return a;
    }

    // Probe: an O_DIRECT read aligned to `size` but not to 2 * size is refused with EINVAL when
    // the file system needs more. Only meaningful where there are bytes to read.
    DirectIoAlignment a;
    if (st.st_size >= 8192) {
        FileDescriptor direct(
            ::open(str_cat("/proc/self/fd/", fd).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
        auto buffer = AlignedBuffer::allocate(16384, 8192);
        if (direct.valid() && buffer.has_value()) {
            for (std::size_t size = 512; size <= 4096; size *= 2) {
                const ssize_t got =
                    ::pread(direct.get(), buffer->data() + size, size, static_cast<off_t>(size));
                if (got >= 0) {
                    a.alignment_bytes = size;
                    a.source = "probe";
                    return a;
                }
                if (errno != EINVAL) break;
            }
        }
    }
    log::debug(path, ": direct-I/O alignment unknown; assuming ", a.alignment_bytes, " bytes");
    return a;
}

}  // namespace zinf::io
