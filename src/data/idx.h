// Readers for the IDX files of MNIST and Fashion-MNIST (gzip-compressed or plain, read with
// zlib): images (magic 0x00000803: unsigned bytes, 3 dimensions) and labels (magic 0x00000801:
// unsigned bytes, 1 dimension). All header fields are big-endian uint32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace zinf::data {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;
// Files larger than this are rejected as corrupt headers rather than allocated.
inline constexpr std::uint64_t kIdxMaxPayloadBytes = std::uint64_t{1} << 32;

struct IdxImages {
    std::size_t count = 0;
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::vector<std::uint8_t> pixels;  // count x rows x cols, row-major
};

struct IdxLabels {
    std::vector<std::uint8_t> labels;
};

// Reads a whole IDX image file. Errors, each naming the file:
//   kNotFound    the file does not exist (`missing_hint`, when not empty, is appended: it says
//                which package provides the file);
//   kIo          it cannot be opened or read (errno kept), or zlib reports an error;
//   kCorruption  wrong magic number, a zero or oversized dimension, truncated data (the message
//                gives the bytes expected and read), or bytes after the data.
Result<IdxImages> read_idx_images(const std::string& path, const std::string& missing_hint = {});
// Reads a whole IDX label file; errors as read_idx_images.
Result<IdxLabels> read_idx_labels(const std::string& path, const std::string& missing_hint = {});

}  // namespace zinf::data
