// Size and count parsing.
#include "src/base/units.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(UnitsTest, Sizes) {
    EXPECT_EQ(*parse_size_bytes("4GiB"), 4ULL << 30);
    EXPECT_EQ(*parse_size_bytes("1MiB"), 1ULL << 20);
    EXPECT_EQ(*parse_size_bytes("16M"), 16ULL << 20);
    EXPECT_EQ(*parse_size_bytes("2GB"), 2000000000ULL);
    EXPECT_EQ(*parse_size_bytes("512"), 512ULL);
    EXPECT_EQ(*parse_size_bytes("0.5GiB"), 512ULL << 20);
    EXPECT_EQ(*parse_size_bytes("1e6"), 1000000ULL);
    EXPECT_FALSE(parse_size_bytes("").has_value());
    EXPECT_FALSE(parse_size_bytes("-1GiB").has_value());
    EXPECT_FALSE(parse_size_bytes("4 parsecs").has_value());
    EXPECT_FALSE(parse_size_bytes("0.3B").has_value());
}

TEST(UnitsTest, Counts) {
    EXPECT_EQ(*parse_count("256M"), 256000000ULL);
    EXPECT_EQ(*parse_count("2G"), 2000000000ULL);
    EXPECT_EQ(*parse_count("1e8"), 100000000ULL);
    EXPECT_EQ(*parse_count("64Mi"), 64ULL << 20);
    EXPECT_EQ(*parse_count("4Ki"), 4096ULL);
}

TEST(UnitsTest, Format) {
    EXPECT_EQ(format_bytes(17), "17 B");
    EXPECT_EQ(format_bytes(1536ULL << 20), "1.50 GiB");
}

}  // namespace
}  // namespace zinf
