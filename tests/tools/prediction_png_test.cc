// The --predict picture: written grids decoded back with libpng's simplified reader and checked
// for geometry, tile pixels, caption colours and glyphs; bad arguments, unwritable places,
// symbolic links and a fault in every file call each end in a clean Status.
#include "tools/train/prediction_png.h"

#include <gtest/gtest.h>
#include <png.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include "tests/support/test_seed.h"

namespace zinf::train {
namespace {

namespace fs = std::filesystem;

constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;

float normalise(int gray) {
    return (static_cast<float>(gray) / 255.0f - kMean) / kStd;
}

struct Decoded {
    std::size_t width = 0;
    std::size_t height = 0;
    std::vector<std::uint8_t> rgb;

    const std::uint8_t* at(std::size_t x, std::size_t y) const {
        return rgb.data() + (y * width + x) * 3;
    }
};

// Decodes a PNG file to 8-bit RGB, or fails the test.
Decoded decode(const std::string& path) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    Decoded out;
    if (png_image_begin_read_from_file(&image, path.c_str()) == 0) {
        ADD_FAILURE() << "png_image_begin_read_from_file " << path << ": " << image.message;
        return out;
    }
    image.format = PNG_FORMAT_RGB;
    out.width = image.width;
    out.height = image.height;
    out.rgb.resize(PNG_IMAGE_SIZE(image));
    if (png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr) == 0) {
        ADD_FAILURE() << "png_image_finish_read " << path << ": " << image.message;
        png_image_free(&image);
    }
    return out;
}

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Owns the pixels that PredictedImage borrows.
struct Sample {
    std::vector<float> pixels;
    std::size_t width;
    std::size_t height;
    int predicted;
    int label;

    PredictedImage view() const { return {pixels, width, height, predicted, label}; }
};

// A sample whose gray levels are a known gradient: pixel (x, y) is (y * width + x) % 256.
Sample gradient_sample(std::size_t width, std::size_t height, int predicted, int label) {
    Sample s{std::vector<float>(width * height), width, height, predicted, label};
    for (std::size_t i = 0; i < s.pixels.size(); ++i)
        s.pixels[i] = normalise(static_cast<int>(i % 256));
    return s;
}

std::vector<PredictedImage> views(const std::vector<Sample>& samples) {
    std::vector<PredictedImage> out;
    for (const Sample& s : samples) out.push_back(s.view());
    return out;
}

bool is_colour(const std::uint8_t* p, const std::uint8_t (&rgb)[3]) {
    return p[0] == rgb[0] && p[1] == rgb[1] && p[2] == rgb[2];
}

// Reddish in any shade, not only the exact caption colour: red clearly above green and blue.
bool is_reddish(const std::uint8_t* p) {
    return p[0] > p[1] + 60 && p[0] > p[2] + 60;
}

// The caption band of cell `index`: every row below the tiles, across the cell.
struct Band {
    std::size_t x0, y0, x1, y1;
};
Band caption_band(const GridLayout& layout, std::size_t index, std::size_t tile_height) {
    return {layout.cell_x(index), layout.cell_y(index) + tile_height,
            layout.cell_x(index) + layout.cell_width, layout.cell_y(index) + layout.cell_height};
}

std::size_t count_in(const Decoded& d, const Band& b, const std::uint8_t (&rgb)[3]) {
    std::size_t n = 0;
    for (std::size_t y = b.y0; y < b.y1; ++y) {
        for (std::size_t x = b.x0; x < b.x1; ++x) n += is_colour(d.at(x, y), rgb) ? 1 : 0;
    }
    return n;
}

// The caption's shape: which pixels of the band are drawn at all (any colour but background).
std::vector<bool> caption_mask(const Decoded& d, const Band& b) {
    std::vector<bool> mask;
    for (std::size_t y = b.y0; y < b.y1; ++y) {
        for (std::size_t x = b.x0; x < b.x1; ++x) {
            const std::uint8_t* p = d.at(x, y);
            mask.push_back(
                !(p[0] == kBackgroundGray && p[1] == kBackgroundGray && p[2] == kBackgroundGray));
        }
    }
    return mask;
}

std::vector<std::string> directory_names(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    return names;
}

// ---- geometry and pixels ---------------------------------------------------------------------

TEST(PredictionGrid, HasColumnsAndRowsForTheImageCountAtTheDocumentedSize) {
    zinf::test::TempDir tmp("png");
    // Fashion-MNIST at the defaults: a 28x28 tile doubled is 56 px; "P:3 T:3" is 7 glyphs of 3
    // px with 1 px between, 27 font px, so glyphs are drawn at 56 / 27 = 2: 54 px wide, 10 tall,
    // 4 px below the tile. A cell is 56 x (56 + 4 + 10) = 56 x 70; with 4 px of padding around and
    // between cells, 5 images in 3 columns make 2 rows: 3 * 60 + 4 = 184 by 2 * 74 + 4 = 152.
    std::vector<Sample> samples;
    for (int i = 0; i < 5; ++i) samples.push_back(gradient_sample(28, 28, 3, 3));
    const auto images = views(samples);
    GridOptions options;
    options.columns = 3;
    ASSERT_TRUE(write_prediction_grid(tmp.file("g.png"), images, options).is_ok());
    const Decoded d = decode(tmp.file("g.png"));
    EXPECT_EQ(d.width, 184u);
    EXPECT_EQ(d.height, 152u);

    auto layout = plan_prediction_grid(images, options);
    ASSERT_TRUE(layout.has_value());
    EXPECT_EQ(layout->columns, 3u);
    EXPECT_EQ(layout->rows, 2u);
    EXPECT_EQ(layout->width, d.width);
    EXPECT_EQ(layout->height, d.height);

    // Fewer images than columns: the grid is only as wide as the images need.
    ASSERT_TRUE(
        write_prediction_grid(tmp.file("one.png"), std::span(images).first(1), options).is_ok());
    const Decoded one = decode(tmp.file("one.png"));
    EXPECT_EQ(one.width, 64u);
    EXPECT_EQ(one.height, 78u);
}

TEST(PredictionGrid, TilePixelsAreTheDenormalisedGradientScaledUp) {
    zinf::test::TempDir tmp("png");
    // 16x16 covers every gray level 0..255 once; two images so the second tile is offset too.
    std::vector<Sample> samples = {gradient_sample(16, 16, 1, 1), gradient_sample(16, 16, 2, 5)};
    const auto images = views(samples);
    GridOptions options;
    options.columns = 2;
    options.scale = 3;
    ASSERT_TRUE(write_prediction_grid(tmp.file("g.png"), images, options).is_ok());
    const Decoded d = decode(tmp.file("g.png"));
    auto layout = plan_prediction_grid(images, options);
    ASSERT_TRUE(layout.has_value());
    ASSERT_EQ(d.width, layout->width);
    ASSERT_EQ(d.height, layout->height);
    const std::size_t tile = 16 * options.scale;
    for (std::size_t i = 0; i < images.size(); ++i) {
        const std::size_t x0 = layout->cell_x(i) + (layout->cell_width - tile) / 2;
        const std::size_t y0 = layout->cell_y(i);
        std::size_t mismatches = 0;
        for (std::size_t y = 0; y < tile; ++y) {
            for (std::size_t x = 0; x < tile; ++x) {
                const auto expected = static_cast<std::uint8_t>((y / 3) * 16 + x / 3);
                const std::uint8_t* p = d.at(x0 + x, y0 + y);
                if (p[0] != expected || p[1] != expected || p[2] != expected) {
                    if (++mismatches <= 5) {
                        ADD_FAILURE() << "image " << i << " (" << x << "," << y << "): got "
                                      << int(p[0]) << "," << int(p[1]) << "," << int(p[2])
                                      << " want gray " << int(expected);
                    }
                }
            }
        }
        EXPECT_EQ(mismatches, 0u) << "image " << i;
    }
}

TEST(PredictionGrid, OutOfRangeAndNanValuesClampToBlackAndWhite) {
    Sample s{{-100.0f, 100.0f, std::numeric_limits<float>::quiet_NaN(),
              std::numeric_limits<float>::infinity()},
             2,
             2,
             0,
             0};
    const std::vector<PredictedImage> images = {s.view()};
    GridOptions options;
    options.scale = 1;
    auto bytes = encode_prediction_grid(images, options);
    ASSERT_TRUE(bytes.has_value()) << bytes.status().to_string();
    zinf::test::TempDir tmp("png");
    {
        std::ofstream out(tmp.file("c.png"), std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes->data()),
                  static_cast<std::streamsize>(bytes->size()));
    }
    const Decoded d = decode(tmp.file("c.png"));
    auto layout = plan_prediction_grid(images, options);
    ASSERT_TRUE(layout.has_value());
    const std::size_t x0 = layout->cell_x(0) + (layout->cell_width - 2) / 2;
    const std::size_t y0 = layout->cell_y(0);
    EXPECT_EQ(d.at(x0, y0)[0], 0);
    EXPECT_EQ(d.at(x0 + 1, y0)[0], 255);
    EXPECT_EQ(d.at(x0, y0 + 1)[0], 0);  // NaN
    EXPECT_EQ(d.at(x0 + 1, y0 + 1)[0], 255);
}

// ---- captions ----------------------------------------------------------------------------------

TEST(PredictionGrid, RightPredictionIsCaptionedGreenWithNoRedAndWrongOneRed) {
    zinf::test::TempDir tmp("png");
    std::vector<Sample> samples = {gradient_sample(28, 28, 4, 4), gradient_sample(28, 28, 4, 9)};
    const auto images = views(samples);
    ASSERT_TRUE(write_prediction_grid(tmp.file("g.png"), images).is_ok());
    const Decoded d = decode(tmp.file("g.png"));
    auto layout = plan_prediction_grid(images);
    ASSERT_TRUE(layout.has_value());
    const std::size_t tile_height = 28 * GridOptions{}.scale;

    const Band right = caption_band(*layout, 0, tile_height);
    EXPECT_GT(count_in(d, right, kRightRgb), 50u);
    EXPECT_EQ(count_in(d, right, kWrongRgb), 0u);
    const Band wrong = caption_band(*layout, 1, tile_height);
    EXPECT_GT(count_in(d, wrong, kWrongRgb), 50u);
    EXPECT_EQ(count_in(d, wrong, kRightRgb), 0u);

    // Nothing reddish anywhere in the right prediction's cell, tile included.
    std::size_t reddish = 0;
    for (std::size_t y = layout->cell_y(0); y < layout->cell_y(0) + layout->cell_height; ++y) {
        for (std::size_t x = layout->cell_x(0); x < layout->cell_x(0) + layout->cell_width; ++x) {
            reddish += is_reddish(d.at(x, y)) ? 1 : 0;
        }
    }
    EXPECT_EQ(reddish, 0u);
}

TEST(PredictionGrid, CaptionGlyphsFollowThePredictedAndTrueClasses) {
    zinf::test::TempDir tmp("png");
    // Every predicted class 0..9 against the same label, then the same prediction twice: the
    // ten captions must all differ and the repeated one must match exactly.
    std::vector<Sample> samples;
    for (int p = 0; p < 10; ++p) samples.push_back(gradient_sample(28, 28, p, 0));
    samples.push_back(gradient_sample(28, 28, 7, 0));
    samples.push_back(gradient_sample(28, 28, 7, 3));  // same prediction, other label
    const auto images = views(samples);
    ASSERT_TRUE(write_prediction_grid(tmp.file("g.png"), images).is_ok());
    const Decoded d = decode(tmp.file("g.png"));
    auto layout = plan_prediction_grid(images);
    ASSERT_TRUE(layout.has_value());
    const std::size_t tile_height = 28 * GridOptions{}.scale;
    std::vector<std::vector<bool>> masks;
    for (std::size_t i = 0; i < images.size(); ++i) {
        masks.push_back(caption_mask(d, caption_band(*layout, i, tile_height)));
    }
    for (int a = 0; a < 10; ++a) {
        for (int b = a + 1; b < 10; ++b) {
            EXPECT_NE(masks[a], masks[b]) << "predicted " << a << " and " << b << " look alike";
        }
    }
    EXPECT_EQ(masks[7], masks[10]) << "the same caption drawn twice differs";
    EXPECT_NE(masks[10], masks[11]) << "the true class is not drawn";
    EXPECT_EQ(prediction_caption(images[11]), "P:7 T:3");
}

// ---- argument errors
// -----------------------------------------------------------------------------

TEST(PredictionGrid, BadArgumentsAreInvalidArgumentAndWriteNoFile) {
    zinf::test::TempDir tmp("png");
    const std::string path = tmp.file("g.png");
    const Sample good = gradient_sample(28, 28, 1, 1);
    Sample short_pixels = good;
    short_pixels.pixels.pop_back();
    Sample zero = good;
    zero.width = 0;
    Sample negative = good;
    negative.label = -1;

    const auto expect_invalid = [&](std::span<const PredictedImage> images,
                                    const GridOptions& options, const char* needle) {
        const Status s = write_prediction_grid(path, images, options);
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
        EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
        EXPECT_FALSE(fs::exists(path)) << needle;
    };
    expect_invalid({}, {}, "no image");
    const std::vector<PredictedImage> wrong_count = {good.view(), short_pixels.view()};
    expect_invalid(wrong_count, {}, "image 1 is 28x28 but has 783 pixels");
    const std::vector<PredictedImage> zero_size = {zero.view()};
    expect_invalid(zero_size, {}, "image 0 is 0x28");
    const std::vector<PredictedImage> negative_class = {negative.view()};
    expect_invalid(negative_class, {}, "non-negative");
    const std::vector<PredictedImage> one = {good.view()};
    expect_invalid(one, GridOptions{.columns = 0}, "columns is 0");
    expect_invalid(one, GridOptions{.scale = 0}, "scale is 0");
    expect_invalid(one, GridOptions{.scale = std::size_t{1} << 40}, "exceeds");
    const Status s = write_prediction_grid(tmp.path() + "/", one);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

// ---- file errors -------------------------------------------------------------------------------

TEST(PredictionGrid, MissingDirectoryIsAnIoErrorNamingThePath) {
    zinf::test::TempDir tmp("png");
    const Sample s = gradient_sample(28, 28, 1, 1);
    const std::vector<PredictedImage> images = {s.view()};
    const std::string path = tmp.file("no-such-dir/g.png");
    const Status st = write_prediction_grid(path, images);
    EXPECT_EQ(st.code(), StatusCode::kIo) << st.to_string();
    EXPECT_EQ(st.errno_value(), ENOENT);
    EXPECT_NE(st.message().find(path), std::string::npos) << st.to_string();
}

TEST(PredictionGrid, ReadOnlyDirectoryIsAnIoErrorNamingThePathAndLeavesNoFile) {
    zinf::test::TempDir tmp("png");
    std::string dir = tmp.file("ro");
    // Root ignores permission bits, so as root the directory is a tmpfs remounted read-only.
    bool mounted = false;
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    if (zinf::test::is_root()) {
        if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
            GTEST_SKIP() << "mount tmpfs: " << std::strerror(errno);
        }
        mounted = true;
        if (::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
            const int err = errno;
            ::umount2(dir.c_str(), MNT_DETACH);
            GTEST_SKIP() << "remount read-only: " << std::strerror(err);
        }
    } else {
        ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
    }
    const Sample s = gradient_sample(28, 28, 1, 1);
    const std::vector<PredictedImage> images = {s.view()};
    const std::string path = dir + "/g.png";
    const Status st = write_prediction_grid(path, images);
    EXPECT_EQ(st.code(), StatusCode::kIo) << st.to_string();
    EXPECT_TRUE(st.errno_value() == EROFS || st.errno_value() == EACCES) << st.to_string();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.to_string();
    EXPECT_TRUE(directory_names(dir).empty());
    if (mounted) {
        ::umount2(dir.c_str(), MNT_DETACH);
    } else {
        ::chmod(dir.c_str(), 0755);
    }
}

TEST(PredictionGrid, FullFileSystemIsNoSpaceAndLeavesNeitherPictureNorTemporaryFile) {
    if (!zinf::test::is_root()) GTEST_SKIP() << "needs root to mount a small tmpfs";
    zinf::test::TempDir tmp("png");
    const std::string dir = tmp.file("full");
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0) {
        GTEST_SKIP() << "mount tmpfs: " << std::strerror(errno);
    }
    // Noise does not compress: 64 images of 28x28 at scale 4 are about 600 KB of PNG.
    std::mt19937 rng(static_cast<std::uint32_t>(zinf::test::seed()));
    std::uniform_real_distribution<float> noise(-1.0f, 3.0f);
    std::vector<Sample> samples;
    for (int i = 0; i < 64; ++i) {
        Sample s = gradient_sample(28, 28, i % 10, (i * 3) % 10);
        for (float& x : s.pixels) x = noise(rng);
        samples.push_back(std::move(s));
    }
    const auto images = views(samples);
    GridOptions options;
    options.scale = 4;
    const std::string path = dir + "/g.png";
    const Status st = write_prediction_grid(path, images, options);
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.to_string();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.to_string();
    EXPECT_TRUE(directory_names(dir).empty());
    ::umount2(dir.c_str(), MNT_DETACH);
}

TEST(PredictionGrid, SymbolicLinkAtThePathIsRefusedAndItsTargetUntouched) {
    zinf::test::TempDir tmp("png");
    const std::string target = tmp.file("precious.txt");
    std::ofstream(target) << "keep me";
    const std::string link = tmp.file("g.png");
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
    const Sample s = gradient_sample(28, 28, 1, 2);
    const std::vector<PredictedImage> images = {s.view()};
    const Status st = write_prediction_grid(link, images);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("symbolic link"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(link), std::string::npos) << st.to_string();
    EXPECT_EQ(read_all(target), "keep me");
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(directory_names(tmp.path()).size(), 2u);  // the link and its target, nothing else
}

TEST(PredictionGrid, AnExistingPictureIsReplacedWhole) {
    zinf::test::TempDir tmp("png");
    const std::string path = tmp.file("g.png");
    std::ofstream(path) << std::string(100000, 'x');  // longer than the new picture
    const Sample s = gradient_sample(28, 28, 1, 1);
    const std::vector<PredictedImage> images = {s.view()};
    ASSERT_TRUE(write_prediction_grid(path, images).is_ok());
    auto bytes = encode_prediction_grid(images);
    ASSERT_TRUE(bytes.has_value());
    const std::string got = read_all(path);
    ASSERT_EQ(got.size(), bytes->size());
    EXPECT_EQ(std::memcmp(got.data(), bytes->data(), got.size()), 0);
    EXPECT_EQ(directory_names(tmp.path()).size(), 1u);
}

TEST(PredictionGrid, AFaultInAnyFileCallLeavesTheOldOrTheWholeNewPictureAndNoTemporaryFile) {
    zinf::test::TempDir tmp("png");
    const std::string path = tmp.file("g.png");
    const Sample old_sample = gradient_sample(28, 28, 1, 1);
    const Sample new_sample = gradient_sample(28, 28, 2, 8);
    const std::vector<PredictedImage> old_images = {old_sample.view()};
    const std::vector<PredictedImage> new_images = {new_sample.view()};
    auto old_bytes = encode_prediction_grid(old_images);
    auto new_bytes = encode_prediction_grid(new_images);
    ASSERT_TRUE(old_bytes.has_value());
    ASSERT_TRUE(new_bytes.has_value());
    const std::string old_text(reinterpret_cast<const char*>(old_bytes->data()), old_bytes->size());
    const std::string new_text(reinterpret_cast<const char*>(new_bytes->data()), new_bytes->size());

    std::uint64_t calls = 0;
    {
        ASSERT_TRUE(write_prediction_grid(path, old_images).is_ok());
        io::FaultyFileSystem counting(io::posix_file_system(), io::FileFaultPlan{});
        ASSERT_TRUE(write_prediction_grid(counting, path, new_images).is_ok());
        calls = counting.ops_counted();
    }
    ASSERT_GE(calls, 5u);  // open dir, open, write, sync, rename, sync dir
    for (std::uint64_t n = 1; n <= calls; ++n) {
        ASSERT_TRUE(write_prediction_grid(path, old_images).is_ok());
        io::FileFaultPlan plan;
        plan.fail_nth_op = n;
        plan.errno_to_inject = n % 2 == 0 ? ENOSPC : EIO;
        io::FaultyFileSystem faulty(io::posix_file_system(), plan);
        const Status st = write_prediction_grid(faulty, path, new_images);
        ASSERT_EQ(faulty.faults_injected(), 1u) << "n=" << n;
        ASSERT_FALSE(st.is_ok()) << "n=" << n << ": a fault was swallowed";
        EXPECT_EQ(st.code(), n % 2 == 0 ? StatusCode::kNoSpace : StatusCode::kIo)
            << "n=" << n << ": " << st.to_string();
        EXPECT_EQ(st.errno_value(), plan.errno_to_inject) << "n=" << n;
        EXPECT_NE(st.message().find(path), std::string::npos)
            << "n=" << n << ": " << st.to_string();
        const std::string got = read_all(path);
        EXPECT_TRUE(got == old_text || got == new_text) << "n=" << n << ": a partial picture";
        EXPECT_EQ(directory_names(tmp.path()), std::vector<std::string>{"g.png"}) << "n=" << n;
    }
}

}  // namespace
}  // namespace zinf::train
