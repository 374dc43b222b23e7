// The prediction grid: layout, the 3x5 caption font, PNG encoding through libpng (whose
// setjmp/longjmp error path is confined to one C-style function) and the atomic file write.
#include "tools/train/prediction_png.h"

#include <fcntl.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <new>

#include "src/base/assert.h"
#include "src/base/log.h"

namespace zinf::train {
namespace {

// The 3x5 font: five rows per glyph, three bits per row, the leftmost pixel in bit 2. Only what
// a caption needs: the digits, 'P', 'T', ':' and the space.
using Glyph = std::uint8_t[kGlyphHeight];
constexpr Glyph kDigitGlyphs[10] = {
    {0b111, 0b101, 0b101, 0b101, 0b111},  // 0
    {0b010, 0b110, 0b010, 0b010, 0b111},  // 1
    {0b111, 0b001, 0b111, 0b100, 0b111},  // 2
    {0b111, 0b001, 0b111, 0b001, 0b111},  // 3
    {0b101, 0b101, 0b111, 0b001, 0b001},  // 4
    {0b111, 0b100, 0b111, 0b001, 0b111},  // 5
    {0b111, 0b100, 0b111, 0b101, 0b111},  // 6
    {0b111, 0b001, 0b001, 0b001, 0b001},  // 7
    {0b111, 0b101, 0b111, 0b101, 0b111},  // 8
    {0b111, 0b101, 0b111, 0b001, 0b111},  // 9
};
constexpr Glyph kGlyphP = {0b110, 0b101, 0b110, 0b100, 0b100};
constexpr Glyph kGlyphT = {0b111, 0b010, 0b010, 0b010, 0b010};
constexpr Glyph kGlyphColon = {0b000, 0b010, 0b000, 0b010, 0b000};
constexpr Glyph kGlyphSpace = {0, 0, 0, 0, 0};

const Glyph& glyph_for(char c) {
    if (c >= '0' && c <= '9') return kDigitGlyphs[c - '0'];
    if (c == 'P') return kGlyphP;
    if (c == 'T') return kGlyphT;
    if (c == ':') return kGlyphColon;
    // prediction_caption() only ever produces the characters above.
    ZINF_ASSERT_MSG(c == ' ', std::string("no glyph for '") + c + "'");
    return kGlyphSpace;
}

// One font column of space between glyphs.
std::size_t caption_width_font_px(std::size_t chars) {
    return chars == 0 ? 0 : chars * (kGlyphWidth + 1) - 1;
}

// a * b, or false when it does not fit in size_t.
bool checked_mul(std::size_t a, std::size_t b, std::size_t* out) {
    return !__builtin_mul_overflow(a, b, out);
}

// The source value mapped back to 0..255. NaN goes to 0 because std::clamp passes it through and
// converting NaN to an integer is undefined; a diverged model must still give a picture.
std::uint8_t to_gray(float x, const GridOptions& options) {
    const float v = (x * options.std + options.mean) * 255.0f;
    if (!(v > 0.0f)) return 0;
    if (v >= 255.0f) return 255;
    return static_cast<std::uint8_t>(std::lround(v));
}

// The gap between a tile and its caption, in output pixels.
std::size_t caption_gap_px(std::size_t glyph_scale) {
    return 2 * glyph_scale;
}

void draw_caption(std::uint8_t* rgb, std::size_t image_width, std::size_t x0, std::size_t y0,
                  const std::string& text, std::size_t glyph_scale, const std::uint8_t* colour) {
    for (std::size_t c = 0; c < text.size(); ++c) {
        const Glyph& glyph = glyph_for(text[c]);
        const std::size_t gx = x0 + c * (kGlyphWidth + 1) * glyph_scale;
        for (std::size_t row = 0; row < kGlyphHeight; ++row) {
            for (std::size_t col = 0; col < kGlyphWidth; ++col) {
                if (((glyph[row] >> (kGlyphWidth - 1 - col)) & 1u) == 0) continue;
                for (std::size_t dy = 0; dy < glyph_scale; ++dy) {
                    const std::size_t y = y0 + row * glyph_scale + dy;
                    std::uint8_t* p = rgb + (y * image_width + gx + col * glyph_scale) * 3;
                    for (std::size_t dx = 0; dx < glyph_scale; ++dx, p += 3) {
                        p[0] = colour[0];
                        p[1] = colour[1];
                        p[2] = colour[2];
                    }
                }
            }
        }
    }
}

// ---- libpng ------------------------------------------------------------------------------------
// libpng reports errors by calling the error function, which must not return; ours longjmps back
// to encode_png_rgb(). Everything libpng calls back into is plain C-style code, and the frame that
// calls setjmp holds no object with a destructor, because the longjmp would skip it.

struct PngContext {
    std::vector<std::byte>* out;  // owned by encode_prediction_grid()
    char error[256];
};

void on_png_error(png_structp png, png_const_charp message) {
    auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
    std::snprintf(ctx->error, sizeof ctx->error, "%s", message != nullptr ? message : "?");
    png_longjmp(png, 1);
}

// Warnings concern optional chunks and gamma, none of which this writer sets.
void on_png_warning(png_structp /*png*/, png_const_charp /*message*/) {}

void on_png_write(png_structp png, png_bytep data, std::size_t length) {
    auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
    const auto* bytes = reinterpret_cast<const std::byte*>(data);
    // bad_alloc must not unwind through libpng's C frames; it becomes a libpng error, raised
    // after the handler has finished so that the longjmp does not leave a catch block.
    bool out_of_memory = false;
    try {
        ctx->out->insert(ctx->out->end(), bytes, bytes + length);
    } catch (const std::bad_alloc&) {
        out_of_memory = true;
    }
    if (out_of_memory) png_error(png, "out of memory for the encoded PNG");
}

void on_png_flush(png_structp /*png*/) {}

// Encodes `height` rows of `width` RGB pixels into ctx->out. Returns false with ctx->error set
// when libpng fails.
bool encode_png_rgb(PngContext* ctx, const std::uint8_t* rgb, png_uint_32 width,
                    png_uint_32 height) {
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, ctx, on_png_error, on_png_warning);
    if (png == nullptr) {
        std::snprintf(ctx->error, sizeof ctx->error, "png_create_write_struct failed");
        return false;
    }
    png_infop info = png_create_info_struct(png);
    if (info == nullptr) {
        png_destroy_write_struct(&png, nullptr);
        std::snprintf(ctx->error, sizeof ctx->error, "png_create_info_struct failed");
        return false;
    }
    // png and info are not modified between here and any longjmp, so they need not be volatile.
    if (setjmp(png_jmpbuf(png)) != 0) {
        png_destroy_write_struct(&png, &info);
        return false;
    }
    png_set_write_fn(png, ctx, on_png_write, on_png_flush);
    png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    const std::size_t stride_bytes = static_cast<std::size_t>(width) * 3;
    for (png_uint_32 y = 0; y < height; ++y) png_write_row(png, rgb + y * stride_bytes);
    png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
    return true;
}

// ---- the file ----------------------------------------------------------------------------------

// A file-system error as this writer reports it: kNoSpace stays, everything else is kIo (a
// missing directory too: to the user it is a place the picture cannot be written), the errno is
// kept and the message names `path`.
Status write_error(const Status& status, const std::string& path) {
    const std::string message = str_cat("writing prediction grid ", path, ": ", status.message());
    if (status.code() == StatusCode::kNoSpace)
        return Status::no_space(message, status.errno_value());
    return Status(StatusCode::kIo, message, status.errno_value());
}

// A temporary name beside `name`, unique within this process and across processes by pid; hidden
// so that a directory listing during the write does not show it as a picture.
std::string temporary_name(const std::string& name) {
    static std::atomic<std::uint64_t> counter{0};
    // NAME_MAX is 255: keep room for the suffix.
    const std::string stem = name.substr(0, std::min<std::size_t>(name.size(), 200));
    return str_cat(".", stem, ".tmp-", static_cast<long>(::getpid()), "-", counter.fetch_add(1));
}

}  // namespace

std::size_t GridLayout::cell_x(std::size_t index) const noexcept {
    ZINF_ASSERT(columns > 0);
    return kGridPaddingPx + (index % columns) * (cell_width + kGridPaddingPx);
}

std::size_t GridLayout::cell_y(std::size_t index) const noexcept {
    ZINF_ASSERT(columns > 0);
    return kGridPaddingPx + (index / columns) * (cell_height + kGridPaddingPx);
}

std::string prediction_caption(const PredictedImage& image) {
    return str_cat("P:", image.predicted, " T:", image.label);
}

Result<GridLayout> plan_prediction_grid(std::span<const PredictedImage> images,
                                        const GridOptions& options) {
    if (images.empty()) return Status::invalid_argument("prediction grid: no image to draw");
    if (options.columns == 0) return Status::invalid_argument("prediction grid: columns is 0");
    if (options.scale == 0) return Status::invalid_argument("prediction grid: scale is 0");
    std::size_t tile_width = 0;
    std::size_t tile_height = 0;
    std::size_t caption_chars = 0;
    for (std::size_t i = 0; i < images.size(); ++i) {
        const PredictedImage& image = images[i];
        if (image.width == 0 || image.height == 0) {
            return Status::invalid_argument(
                str_cat("prediction grid: image ", i, " is ", image.width, "x", image.height));
        }
        std::size_t numel = 0;
        if (!checked_mul(image.width, image.height, &numel) || image.pixels.size() != numel) {
            return Status::invalid_argument(str_cat("prediction grid: image ", i, " is ",
                                                    image.width, "x", image.height, " but has ",
                                                    image.pixels.size(), " pixels"));
        }
        if (image.predicted < 0 || image.label < 0) {
            return Status::invalid_argument(str_cat("prediction grid: image ", i, " has class ",
                                                    image.predicted, " predicted, ", image.label,
                                                    " true; classes are non-negative"));
        }
        std::size_t w = 0;
        std::size_t h = 0;
        if (!checked_mul(image.width, options.scale, &w) ||
            !checked_mul(image.height, options.scale, &h) || w > kGridMaxPixels ||
            h > kGridMaxPixels) {
            return Status::invalid_argument(str_cat("prediction grid: image ", i, " at scale ",
                                                    options.scale, " exceeds ", kGridMaxPixels,
                                                    " pixels"));
        }
        tile_width = std::max(tile_width, w);
        tile_height = std::max(tile_height, h);
        caption_chars = std::max(caption_chars, prediction_caption(image).size());
    }
    GridLayout layout;
    const std::size_t caption_font_px = caption_width_font_px(caption_chars);
    // As large as the tile is wide allows, so that captions grow with the tiles.
    layout.glyph_scale = std::max<std::size_t>(1, tile_width / caption_font_px);
    layout.caption_height = kGlyphHeight * layout.glyph_scale;
    layout.cell_width = std::max(tile_width, caption_font_px * layout.glyph_scale);
    layout.cell_height = tile_height + caption_gap_px(layout.glyph_scale) + layout.caption_height;
    layout.columns = std::min(options.columns, images.size());
    layout.rows = (images.size() + layout.columns - 1) / layout.columns;
    // Each factor is at most kGridMaxPixels (2^26) plus a little, and a count at most 2^64 / 2^27,
    // but the products can still overflow for absurd image counts: check them.
    std::size_t width = 0;
    std::size_t height = 0;
    std::size_t pixels = 0;
    if (!checked_mul(layout.columns, layout.cell_width + kGridPaddingPx, &width) ||
        !checked_mul(layout.rows, layout.cell_height + kGridPaddingPx, &height) ||
        !checked_mul(width + kGridPaddingPx, height + kGridPaddingPx, &pixels) ||
        pixels > kGridMaxPixels) {
        return Status::invalid_argument(str_cat("prediction grid: ", images.size(), " images in ",
                                                layout.columns, " columns exceed ", kGridMaxPixels,
                                                " pixels"));
    }
    layout.width = width + kGridPaddingPx;
    layout.height = height + kGridPaddingPx;
    ZINF_ASSERT(layout.cell_x(images.size() - 1) + layout.cell_width + kGridPaddingPx <=
                layout.width);
    ZINF_ASSERT(layout.cell_y(images.size() - 1) + layout.cell_height + kGridPaddingPx ==
                layout.height);
    return layout;
}

Result<std::vector<std::byte>> encode_prediction_grid(std::span<const PredictedImage> images,
                                                      const GridOptions& options) {
    ZINF_ASSIGN_OR_RETURN(const GridLayout layout, plan_prediction_grid(images, options));
    std::vector<std::uint8_t> rgb;
    std::vector<std::byte> png_bytes;
    try {
        rgb.assign(layout.width * layout.height * 3, kBackgroundGray);
        // Most of a grid is flat background and compresses well; a quarter of the raw size
        // avoids most regrowth.
        png_bytes.reserve(rgb.size() / 4 + 1024);
    } catch (const std::bad_alloc&) {
        return Status::internal(str_cat("prediction grid: out of memory for a ", layout.width, "x",
                                        layout.height, " picture"));
    }
    const std::size_t tile_height =
        layout.cell_height - caption_gap_px(layout.glyph_scale) - layout.caption_height;
    for (std::size_t i = 0; i < images.size(); ++i) {
        const PredictedImage& image = images[i];
        const std::size_t tile_width = image.width * options.scale;
        const std::size_t x0 = layout.cell_x(i) + (layout.cell_width - tile_width) / 2;
        const std::size_t y0 = layout.cell_y(i);
        for (std::size_t sy = 0; sy < image.height; ++sy) {
            for (std::size_t sx = 0; sx < image.width; ++sx) {
                const std::uint8_t gray = to_gray(image.pixels[sy * image.width + sx], options);
                for (std::size_t dy = 0; dy < options.scale; ++dy) {
                    const std::size_t y = y0 + sy * options.scale + dy;
                    std::uint8_t* p = rgb.data() + (y * layout.width + x0 + sx * options.scale) * 3;
                    std::fill(p, p + options.scale * 3, gray);
                }
            }
        }
        const std::string caption = prediction_caption(image);
        const std::size_t caption_width =
            caption_width_font_px(caption.size()) * layout.glyph_scale;
        ZINF_ASSERT(caption_width <= layout.cell_width);
        const std::size_t cx = layout.cell_x(i) + (layout.cell_width - caption_width) / 2;
        const std::size_t cy = y0 + tile_height + caption_gap_px(layout.glyph_scale);
        draw_caption(rgb.data(), layout.width, cx, cy, caption, layout.glyph_scale,
                     image.predicted == image.label ? kRightRgb : kWrongRgb);
    }
    PngContext ctx{&png_bytes, {}};
    // plan_prediction_grid() bounds both sides by kGridMaxPixels < 2^31, PNG's limit.
    static_assert(kGridMaxPixels < (std::size_t{1} << 31));
    if (!encode_png_rgb(&ctx, rgb.data(), static_cast<png_uint_32>(layout.width),
                        static_cast<png_uint_32>(layout.height))) {
        return Status::internal(str_cat("prediction grid: libpng: ", ctx.error));
    }
    return png_bytes;
}

Status write_prediction_grid(const std::string& path, std::span<const PredictedImage> images,
                             const GridOptions& options) {
    return write_prediction_grid(io::posix_file_system(), path, images, options);
}

Status write_prediction_grid(io::FileSystem& fs, const std::string& path,
                             std::span<const PredictedImage> images, const GridOptions& options) {
    // Encode first: a bad argument must not create or touch any file.
    ZINF_ASSIGN_OR_RETURN(const std::vector<std::byte> bytes,
                          encode_prediction_grid(images, options));
    const std::size_t slash = path.rfind('/');
    const std::string dir_path =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (name.empty() || name == "." || name == "..") {
        return Status::invalid_argument(str_cat("prediction grid: '", path, "' names no file"));
    }
    // A link in the directory part is the user's own choice of where to write; only the last
    // component is never followed.
    auto dir = fs.open_directory(dir_path, /*follow_last=*/true);
    if (!dir.has_value()) return write_error(dir.error(), path);

    // rename(2) would replace a link rather than write through it, so its target is safe either
    // way; refusing says so instead of silently turning the link into a file.
    struct stat st {};
    if (::fstatat(dir->fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode)) {
            return Status::invalid_argument(
                str_cat("prediction grid: ", path, " is a symbolic link; refusing to replace it"));
        }
        if (S_ISDIR(st.st_mode)) {
            return Status::invalid_argument(str_cat("prediction grid: ", path, " is a directory"));
        }
    } else if (errno != ENOENT) {
        return write_error(Status::from_errno(errno, str_cat("stat ", path)), path);
    }

    const std::string temp = temporary_name(name);
    auto file = fs.open_at(*dir, temp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (!file.has_value()) return write_error(file.error(), path);
    const std::string what = dir->path_of(temp);
    Status s = fs.write_all(file->get(), bytes, what);
    // The bytes must be on disk before the rename makes them the picture, or a crash could leave
    // an empty file under `path`.
    if (s.is_ok()) s = fs.sync(file->get(), /*data_only=*/false, what);
    file->reset();
    if (s.is_ok()) s = fs.rename_at(*dir, temp, name);
    if (!s.is_ok()) {
        // Best effort: the error that matters is the one above.
        (void)fs.remove_at(*dir, temp, /*directory=*/false);
        return write_error(s, path);
    }
    // The rename itself is durable only once the directory is synced. The picture is complete
    // under `path` either way; a failure here is still reported.
    s = fs.sync(dir->fd(), /*data_only=*/false, dir->path());
    if (!s.is_ok()) return write_error(s, path);
    return Status::ok();
}

}  // namespace zinf::train
