// The IDX readers on small hand-made gzip files (good, bad magic, truncated, trailing bytes,
// missing) and the Fashion-MNIST loader on the real dataset when it is installed.
#include "src/data/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "src/data/dataset.h"
#include "tests/support/test_seed.h"

namespace zinf::data {
namespace {

void put_u32(std::vector<std::uint8_t>& bytes, std::uint32_t value) {
    bytes.push_back(static_cast<std::uint8_t>(value >> 24));
    bytes.push_back(static_cast<std::uint8_t>(value >> 16));
    bytes.push_back(static_cast<std::uint8_t>(value >> 8));
    bytes.push_back(static_cast<std::uint8_t>(value));
}

void write_gz(const std::string& path, const std::vector<std::uint8_t>& bytes) {
    gzFile file = gzopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    if (!bytes.empty()) {
        ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
                  static_cast<int>(bytes.size()));
    }
    ASSERT_EQ(gzclose(file), Z_OK);
}

std::vector<std::uint8_t> images_file(std::uint32_t count, std::uint32_t rows, std::uint32_t cols,
                                      std::uint32_t magic = kIdxImagesMagic) {
    std::vector<std::uint8_t> bytes;
    put_u32(bytes, magic);
    put_u32(bytes, count);
    put_u32(bytes, rows);
    put_u32(bytes, cols);
    for (std::uint32_t i = 0; i < count * rows * cols; ++i)
        bytes.push_back(static_cast<std::uint8_t>(i * 7));
    return bytes;
}

std::vector<std::uint8_t> labels_file(std::uint32_t count, std::uint32_t magic = kIdxLabelsMagic) {
    std::vector<std::uint8_t> bytes;
    put_u32(bytes, magic);
    put_u32(bytes, count);
    for (std::uint32_t i = 0; i < count; ++i) bytes.push_back(static_cast<std::uint8_t>(i % 10));
    return bytes;
}

TEST(Idx, ReadsImagesAndLabels) {
    test::TempDir dir("idx");
    write_gz(dir.file("images.gz"), images_file(3, 2, 5));
    write_gz(dir.file("labels.gz"), labels_file(3));
    auto images = read_idx_images(dir.file("images.gz"));
    ASSERT_TRUE(images.has_value()) << images.status().to_string();
    EXPECT_EQ(images->count, 3u);
    EXPECT_EQ(images->rows, 2u);
    EXPECT_EQ(images->cols, 5u);
    ASSERT_EQ(images->pixels.size(), 30u);
    EXPECT_EQ(images->pixels[29], static_cast<std::uint8_t>(29 * 7));
    auto labels = read_idx_labels(dir.file("labels.gz"));
    ASSERT_TRUE(labels.has_value()) << labels.status().to_string();
    EXPECT_EQ(labels->labels, (std::vector<std::uint8_t>{0, 1, 2}));
}

TEST(Idx, RejectsBadMagicNamingTheFile) {
    test::TempDir dir("idx");
    write_gz(dir.file("images.gz"), images_file(1, 2, 2, 0x00000801));
    auto images = read_idx_images(dir.file("images.gz"));
    ASSERT_FALSE(images.has_value());
    EXPECT_EQ(images.error().code(), StatusCode::kCorruption);
    EXPECT_NE(images.error().message().find("magic"), std::string::npos);
    EXPECT_NE(images.error().message().find(dir.file("images.gz")), std::string::npos);
    // A label file is not an image file and vice versa.
    write_gz(dir.file("labels.gz"), images_file(1, 2, 2));
    EXPECT_EQ(read_idx_labels(dir.file("labels.gz")).error().code(), StatusCode::kCorruption);
}

TEST(Idx, RejectsTruncatedData) {
    test::TempDir dir("idx");
    auto bytes = images_file(4, 3, 3);
    // erase, not resize(size - 5): GCC 12 at -O1 warns (-Wstringop-overflow) on the resize.
    bytes.erase(bytes.end() - 5, bytes.end());
    write_gz(dir.file("short.gz"), bytes);
    auto images = read_idx_images(dir.file("short.gz"));
    ASSERT_FALSE(images.has_value());
    EXPECT_EQ(images.error().code(), StatusCode::kCorruption);
    EXPECT_NE(images.error().message().find("truncated"), std::string::npos)
        << images.error().to_string();
    // A truncated header.
    write_gz(dir.file("header.gz"), std::vector<std::uint8_t>{0, 0, 8});
    EXPECT_NE(read_idx_labels(dir.file("header.gz")).error().message().find("truncated header"),
              std::string::npos);
    // An empty file.
    write_gz(dir.file("empty.gz"), {});
    EXPECT_EQ(read_idx_images(dir.file("empty.gz")).error().code(), StatusCode::kCorruption);
}

TEST(Idx, RejectsTrailingBytesAndZeroDimensions) {
    test::TempDir dir("idx");
    auto bytes = labels_file(5);
    bytes.push_back(1);
    write_gz(dir.file("long.gz"), bytes);
    auto labels = read_idx_labels(dir.file("long.gz"));
    ASSERT_FALSE(labels.has_value());
    EXPECT_NE(labels.error().message().find("after"), std::string::npos);
    write_gz(dir.file("zero.gz"), images_file(0, 28, 28));
    EXPECT_NE(read_idx_images(dir.file("zero.gz")).error().message().find("zero"),
              std::string::npos);
}

TEST(Idx, RejectsCorruptGzipStreams) {
    test::TempDir dir("idx");
    write_gz(dir.file("good.gz"), images_file(20, 10, 10));
    // Flip bytes in the middle of the compressed stream.
    {
        std::FILE* file = std::fopen(dir.file("good.gz").c_str(), "r+b");
        ASSERT_NE(file, nullptr);
        std::fseek(file, 30, SEEK_SET);
        const std::uint8_t garbage[8] = {0xff, 0x00, 0xff, 0x00, 0xde, 0xad, 0xbe, 0xef};
        std::fwrite(garbage, 1, sizeof garbage, file);
        std::fclose(file);
    }
    auto images = read_idx_images(dir.file("good.gz"));
    ASSERT_FALSE(images.has_value());
    EXPECT_EQ(images.error().code(), StatusCode::kCorruption) << images.error().to_string();
}

TEST(Idx, MissingFileNamesTheFileAndThePackage) {
    test::TempDir dir("idx");
    FashionMnistOptions options;
    options.directory = dir.path();
    auto dataset = load_fashion_mnist(options);
    ASSERT_FALSE(dataset.has_value());
    EXPECT_EQ(dataset.error().code(), StatusCode::kNotFound);
    EXPECT_NE(dataset.error().message().find("train-images-idx3-ubyte.gz"), std::string::npos);
    EXPECT_NE(dataset.error().message().find("apt-get install dataset-fashion-mnist"),
              std::string::npos);
}

TEST(Idx, LoaderChecksThePublishedSizes) {
    test::TempDir dir("idx");
    write_gz(dir.file("t10k-images-idx3-ubyte.gz"), images_file(10, 28, 28));
    write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), labels_file(10));
    FashionMnistOptions options;
    options.directory = dir.path();
    options.split = Split::kTest;
    auto dataset = load_fashion_mnist(options);
    ASSERT_FALSE(dataset.has_value());
    EXPECT_EQ(dataset.error().code(), StatusCode::kCorruption);
    EXPECT_NE(dataset.error().message().find("expected 10000 images"), std::string::npos);
}

bool fashion_mnist_installed() {
    return std::filesystem::exists(std::string(kFashionMnistDirectory) +
                                   "/t10k-images-idx3-ubyte.gz");
}

TEST(FashionMnist, LoadsTheTestSplitNormalised) {
    if (!fashion_mnist_installed()) {
        GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
    }
    FashionMnistOptions options;
    options.split = Split::kTest;
    auto dataset = load_fashion_mnist(options);
    ASSERT_TRUE(dataset.has_value()) << dataset.status().to_string();
    EXPECT_EQ((*dataset)->count(), kFashionMnistTestCount);
    EXPECT_EQ((*dataset)->features(), 784u);
    EXPECT_EQ((*dataset)->classes(), 10u);
    // The test split's statistics are close to the training split's normalisation constants.
    double sum = 0, sum_sq = 0;
    for (const float v : (*dataset)->inputs()) {
        sum += v;
        sum_sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>((*dataset)->inputs().size());
    EXPECT_NEAR(sum / n, 0.0, 0.02);
    EXPECT_NEAR(sum_sq / n - (sum / n) * (sum / n), 1.0, 0.05);
    std::vector<int> per_class(10, 0);
    for (const std::int32_t label : (*dataset)->labels()) ++per_class[label];
    for (const int count : per_class) EXPECT_EQ(count, 1000);  // the test split is balanced
    // Unnormalised pixels lie in [0, 1].
    options.normalize = false;
    options.limit = 50;
    auto raw = load_fashion_mnist(options);
    ASSERT_TRUE(raw.has_value());
    EXPECT_EQ((*raw)->count(), 50u);
    for (const float v : (*raw)->inputs()) {
        ASSERT_GE(v, 0.0f);
        ASSERT_LE(v, 1.0f);
    }
}

}  // namespace
}  // namespace zinf::data
