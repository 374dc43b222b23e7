// AlignedBuffer: posix_memalign-backed storage.
#include "src/base/aligned.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "src/base/log.h"

namespace zinf {

Result<AlignedBuffer> AlignedBuffer::allocate(std::size_t size_bytes, std::size_t alignment,
                                              bool zero_fill) {
    ZINF_ASSERT(alignment >= sizeof(void*));
    ZINF_ASSERT((alignment & (alignment - 1)) == 0);
    if (size_bytes == 0) return AlignedBuffer();
    const std::size_t rounded = align_up(size_bytes, alignment);
    void* ptr = nullptr;
    const int rc = posix_memalign(&ptr, alignment, rounded);
    if (rc != 0) {
        return Status::from_errno(rc,
                                  str_cat("allocating ", rounded, " bytes aligned to ", alignment));
    }
    if (zero_fill) std::memset(ptr, 0, rounded);
    return AlignedBuffer(static_cast<std::byte*>(ptr), rounded);
}

Result<AlignedBuffer> AlignedBuffer::allocate_for_io(std::size_t size_bytes, bool zero_fill) {
    if (size_bytes < kHugePageBytes) return allocate(size_bytes, kDefaultAlignmentBytes, zero_fill);
    ZINF_ASSIGN_OR_RETURN(AlignedBuffer buffer,
                          allocate(size_bytes, kHugePageBytes, /*zero_fill=*/false));
    (void)advise_huge_pages(buffer.span());
    buffer.keep_out_of_children();
    if (zero_fill) std::memset(buffer.data(), 0, buffer.size());
    return buffer;
}

std::size_t advise_huge_pages(std::span<std::byte> region) noexcept {
    const auto begin = reinterpret_cast<std::uintptr_t>(region.data());
    const std::uintptr_t first = align_up(begin, kHugePageBytes);
    const std::uintptr_t last = align_down(begin + region.size(), kHugePageBytes);
    if (region.empty() || last <= first) return 0;
    if (::madvise(region.data() + (first - begin), last - first, MADV_HUGEPAGE) != 0) {
        log::debug("madvise(MADV_HUGEPAGE) of ", last - first, " bytes: ", std::strerror(errno));
        return 0;
    }
    return last - first;
}

Result<std::size_t> huge_page_bytes_backing(std::span<const std::byte> region) {
    std::ifstream smaps("/proc/self/smaps");
    if (!smaps) return Status::not_supported("cannot read /proc/self/smaps");
    const auto begin = reinterpret_cast<std::uintptr_t>(region.data());
    const std::uintptr_t end = begin + region.size();
    std::size_t total_kib = 0;
    bool inside = false;
    std::string line;
    while (std::getline(smaps, line)) {
        unsigned long lo = 0, hi = 0;
        // A mapping's header: "lo-hi perms offset dev inode [path]", both bounds in hex.
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
            line.find('-') < line.find(' ')) {
            inside = lo < end && begin < hi;
            continue;
        }
        unsigned long kib = 0;
        if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1)
            total_kib += kib;
    }
    return total_kib * 1024;
}

bool transparent_huge_pages_available() noexcept {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string text;
    std::getline(in, text);
    return text.find("[always]") != std::string::npos ||
           text.find("[madvise]") != std::string::npos;
}

std::size_t advise_dont_fork(std::span<std::byte> region, bool dont_fork) noexcept {
    const auto begin = reinterpret_cast<std::uintptr_t>(region.data());
    const std::uintptr_t first = align_up(begin, kPageBytes);
    const std::uintptr_t last = align_down(begin + region.size(), kPageBytes);
    if (region.empty() || last <= first) return 0;
    if (::madvise(region.data() + (first - begin), last - first,
                  dont_fork ? MADV_DONTFORK : MADV_DOFORK) != 0) {
        log::debug("madvise(MADV_", dont_fork ? "DONTFORK" : "DOFORK", ") of ", last - first,
                   " bytes: ", std::strerror(errno));
        return 0;
    }
    return last - first;
}

void AlignedBuffer::keep_out_of_children() noexcept {
    if (dont_fork_ || size_bytes_ == 0) return;
    dont_fork_ = advise_dont_fork(span(), true) > 0;
}

void AlignedBuffer::release() noexcept {
    if (dont_fork_) (void)advise_dont_fork(span(), false);
    std::free(data_);
    data_ = nullptr;
    size_bytes_ = 0;
    dont_fork_ = false;
}

AlignedBuffer::~AlignedBuffer() {
    release();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      dont_fork_(std::exchange(other.dont_fork_, false)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        size_bytes_ = std::exchange(other.size_bytes_, 0);
        dont_fork_ = std::exchange(other.dont_fork_, false);
    }
    return *this;
}

}  // namespace zinf
