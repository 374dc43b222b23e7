// IDX readers over zlib's gzread, which also reads uncompressed files transparently.
#include "src/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <span>
#include <utility>

#include "src/base/log.h"

namespace zinf::data {
namespace {

// Owns a gzFile.
class GzFile {
public:
    explicit GzFile(gzFile file) noexcept : file_(file) {}
    ~GzFile() {
        if (file_ != nullptr) gzclose(file_);
    }
    GzFile(const GzFile&) = delete;
    GzFile& operator=(const GzFile&) = delete;
    gzFile get() const noexcept { return file_; }

private:
    gzFile file_;
};

Result<std::unique_ptr<GzFile>> open_gz(const std::string& path, const std::string& missing_hint) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) {
            std::string message = str_cat(path, ": no such file");
            if (!missing_hint.empty()) message += str_cat(" (", missing_hint, ")");
            return Status::not_found(std::move(message), err);
        }
        return Status::from_errno(err, str_cat("stat ", path));
    }
    errno = 0;
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) {
        const int err = errno != 0 ? errno : EIO;
        return Status::io_error(str_cat("gzopen ", path, ": ", std::strerror(err)), err);
    }
    // Larger than zlib's default 8 KiB: fewer read syscalls for the 26 MB training images.
    gzbuffer(file, 1u << 17);
    return std::make_unique<GzFile>(file);
}

// Reads exactly out.size() bytes at byte `offset` of the decompressed stream; `what` names the
// field for messages.
Status read_exact(const GzFile& file, const std::string& path, std::uint64_t offset,
                  std::span<std::uint8_t> out, const char* what) {
    std::size_t done = 0;
    while (done < out.size()) {
        const std::size_t chunk = std::min<std::size_t>(out.size() - done, 1u << 30);
        const int got = gzread(file.get(), out.data() + done, static_cast<unsigned>(chunk));
        if (got < 0) {
            int zerr = 0;
            const char* message = gzerror(file.get(), &zerr);
            if (zerr == Z_ERRNO) return Status::from_errno(errno, str_cat("reading ", path));
            return Status::corruption(str_cat(path, ": zlib error while reading ", what,
                                              " at byte ", offset + done, ": ",
                                              message != nullptr ? message : "?"));
        }
        if (got == 0) {
            return Status::corruption(str_cat(path, ": truncated ", what, ": expected ", out.size(),
                                              " bytes at byte ", offset, ", got ", done));
        }
        done += static_cast<std::size_t>(got);
    }
    return Status::ok();
}

std::uint32_t big_endian_u32(const std::uint8_t* bytes) noexcept {
    return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
           (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
}

// Reads the magic number and `dims` dimensions, checking the magic.
template <std::size_t kDims>
Result<std::array<std::uint32_t, kDims>> read_header(const GzFile& file, const std::string& path,
                                                     std::uint32_t magic_expected) {
    std::array<std::uint8_t, 4 * (kDims + 1)> header{};
    ZINF_TRY(read_exact(file, path, 0, header, "header"));
    const std::uint32_t magic = big_endian_u32(header.data());
    if (magic != magic_expected) {
        return Status::corruption(str_cat(path, ": bad IDX magic number 0x", std::hex, magic,
                                          ", expected 0x", magic_expected, std::dec,
                                          " (is this the right file?)"));
    }
    std::array<std::uint32_t, kDims> dims{};
    for (std::size_t d = 0; d < kDims; ++d) {
        dims[d] = big_endian_u32(header.data() + 4 * (d + 1));
        if (dims[d] == 0) {
            return Status::corruption(str_cat(path, ": IDX dimension ", d, " is zero"));
        }
    }
    return dims;
}

// After the payload the stream must end: more bytes mean the header's sizes are wrong.
Status expect_end(const GzFile& file, const std::string& path, std::uint64_t payload_end) {
    std::uint8_t extra = 0;
    const int got = gzread(file.get(), &extra, 1);
    if (got < 0) {
        int zerr = 0;
        const char* message = gzerror(file.get(), &zerr);
        return Status::corruption(str_cat(
            path, ": zlib error at the end of the data: ", message != nullptr ? message : "?"));
    }
    if (got > 0) {
        return Status::corruption(str_cat(path, ": unexpected bytes after the ", payload_end,
                                          " bytes the IDX header announces"));
    }
    return Status::ok();
}

}  // namespace

Result<IdxImages> read_idx_images(const std::string& path, const std::string& missing_hint) {
    ZINF_ASSIGN_OR_RETURN(auto file, open_gz(path, missing_hint));
    ZINF_ASSIGN_OR_RETURN(auto dims, read_header<3>(*file, path, kIdxImagesMagic));
    const std::uint64_t payload = std::uint64_t{dims[0]} * dims[1] * dims[2];
    if (payload > kIdxMaxPayloadBytes) {
        return Status::corruption(str_cat(path, ": IDX header announces ", dims[0], " x ", dims[1],
                                          " x ", dims[2], " bytes, over the ", kIdxMaxPayloadBytes,
                                          "-byte limit"));
    }
    IdxImages images;
    images.count = dims[0];
    images.rows = dims[1];
    images.cols = dims[2];
    images.pixels.resize(payload);
    ZINF_TRY(read_exact(*file, path, 16, images.pixels, "image data"));
    ZINF_TRY(expect_end(*file, path, 16 + payload));
    return images;
}

Result<IdxLabels> read_idx_labels(const std::string& path, const std::string& missing_hint) {
    ZINF_ASSIGN_OR_RETURN(auto file, open_gz(path, missing_hint));
    ZINF_ASSIGN_OR_RETURN(auto dims, read_header<1>(*file, path, kIdxLabelsMagic));
    // A 32-bit count of one-byte labels is within kIdxMaxPayloadBytes by construction.
    static_assert(std::uint64_t{UINT32_MAX} <= kIdxMaxPayloadBytes);
    IdxLabels labels;
    labels.labels.resize(dims[0]);
    ZINF_TRY(read_exact(*file, path, 8, labels.labels, "label data"));
    ZINF_TRY(expect_end(*file, path, 8 + std::uint64_t{dims[0]}));
    return labels;
}

}  // namespace zinf::data
