// The picture behind `zinfinity-train --predict N`: predicted samples of an image data set laid
// out as one RGB PNG grid, each tile captioned "P:<predicted> T:<label>" in green when the model
// was right and in red when it was wrong, so that a user sees at a glance what the model learned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "src/base/status.h"

namespace zinf::train {

// One predicted sample. `pixels` holds width * height normalised values, row-major, as the model
// saw them (x = (pixel / 255 - mean) / std); it is borrowed for the duration of the call.
struct PredictedImage {
    std::span<const float> pixels;
    std::size_t width = 28;
    std::size_t height = 28;
    int predicted = 0;
    int label = 0;
};

// Defaults fit Fashion-MNIST: its normalisation, and tiles doubled so the 28x28 images and their
// captions stay legible.
struct GridOptions {
    std::size_t columns = 8;
    std::size_t scale = 2;  // each source pixel becomes scale x scale output pixels
    float mean = 0.2860f;
    float std = 0.3530f;
};

// Where things are in the grid: every cell is cell_width x cell_height, cells are separated and
// framed by kGridPaddingPx of background, the tile sits centred at the top of its cell and the
// caption centred below it. Exposed so that tests and callers need not re-derive the geometry.
struct GridLayout {
    std::size_t width = 0;  // of the whole PNG, in pixels
    std::size_t height = 0;
    std::size_t columns = 0;  // used: min(options.columns, image count)
    std::size_t rows = 0;
    std::size_t cell_width = 0;
    std::size_t cell_height = 0;
    std::size_t glyph_scale = 0;     // each font pixel becomes glyph_scale x glyph_scale pixels
    std::size_t caption_height = 0;  // kGlyphHeight * glyph_scale

    // Top-left corner of image `index`'s cell.
    std::size_t cell_x(std::size_t index) const noexcept;
    std::size_t cell_y(std::size_t index) const noexcept;
};

inline constexpr std::size_t kGridPaddingPx = 4;
inline constexpr std::size_t kGlyphWidth = 3;  // the built-in font's glyphs are 3x5
inline constexpr std::size_t kGlyphHeight = 5;
// The colours a caption is drawn in; the background is white and the tiles are gray, so a pixel
// with these channels can only belong to a caption.
inline constexpr std::uint8_t kRightRgb[3] = {0, 150, 0};
inline constexpr std::uint8_t kWrongRgb[3] = {210, 0, 0};
inline constexpr std::uint8_t kBackgroundGray = 255;

// The caption of one image: "P:<predicted> T:<label>".
std::string prediction_caption(const PredictedImage& image);

// The largest grid drawn, in pixels: 192 MiB of RGB, far beyond any useful picture, and small
// enough that every coordinate fits PNG's 2^31 - 1 limit.
inline constexpr std::size_t kGridMaxPixels = std::size_t{1} << 26;

// Checks the images and options and computes the grid's geometry. Errors: kInvalidArgument for
// no image, zero columns or scale, an image with a zero dimension, a pixel span whose size is not
// width * height, a negative class, or a grid over kGridMaxPixels. Pure; allocates only for the
// captions it measures and for messages.
Result<GridLayout> plan_prediction_grid(std::span<const PredictedImage> images,
                                        const GridOptions& options = {});

// Encodes the grid as PNG bytes in memory (libpng, 8-bit RGB, no interlacing). Each source pixel
// maps back to gray = clamp(round((x * std + mean) * 255), 0, 255), NaN to 0, replicated to RGB.
// Errors: those of plan_prediction_grid; kInternal when libpng or an allocation fails (libpng's
// longjmp is contained here and never crosses a C++ frame with live destructors).
Result<std::vector<std::byte>> encode_prediction_grid(std::span<const PredictedImage> images,
                                                      const GridOptions& options = {});

// Writes the grid as one PNG file at `path`, atomically: the bytes go to a temporary name in the
// same directory, are fsynced and renamed over `path`, and the directory is fsynced, so `path`
// always holds either its previous contents or the complete new picture. A symbolic link at
// `path` is refused (its target is never touched), as is a directory. Blocks on file I/O; not
// safe to call concurrently for the same path.
// Errors: those of plan_prediction_grid and encode_prediction_grid; kInvalidArgument for a path
// with no file name, a symbolic link or a directory at `path`; kNoSpace (ENOSPC, EDQUOT) or kIo
// (every other errno, including a missing or read-only directory) for a failed open, write,
// sync or rename, with the errno and a message naming `path`. On error no temporary file is left.
Status write_prediction_grid(const std::string& path, std::span<const PredictedImage> images,
                             const GridOptions& options = {});
// The same through a FileSystem, so tests can fail any of its calls (io::FaultyFileSystem).
Status write_prediction_grid(io::FileSystem& fs, const std::string& path,
                             std::span<const PredictedImage> images,
                             const GridOptions& options = {});

}  // namespace zinf::train
