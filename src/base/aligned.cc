// AlignedBuffer: posix_memalign-backed storage.
#include "src/base/aligned.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
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
        return Status::from_errno(rc, str_cat("allocating ", rounded, " bytes aligned to ", alignment));
    }
    if (zero_fill) std::memset(ptr, 0, rounded);
    return AlignedBuffer(static_cast<std::byte*>(ptr), rounded);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_bytes_(std::exchange(other.size_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
        std::free(data_);
        data_ = std::exchange(other.data_, nullptr);
        size_bytes_ = std::exchange(other.size_bytes_, 0);
    }
    return *this;
}

}  // namespace zinf
