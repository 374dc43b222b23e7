// AlignedBuffer and the huge-page helpers: I/O buffers end up in transparent huge pages where the
// kernel hands them out, and plain buffers do not ask for them.
#include "src/base/aligned.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <fstream>
#include <string>

namespace zinf {
namespace {

std::string thp_mode() {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string text;
    std::getline(in, text);
    return text;
}

TEST(AlignedBuffer, IoBuffersFromTwoMiBAreHugePageAlignedAndBackedByHugePages) {
    auto small = AlignedBuffer::allocate_for_io(64 * 1024, /*zero_fill=*/true);
    ASSERT_TRUE(small.has_value()) << small.status().to_string();
    EXPECT_TRUE(is_aligned(small->data(), kDefaultAlignmentBytes));
    EXPECT_EQ(small->size(), 64u * 1024);

    constexpr std::size_t kBytes = 8 * kHugePageBytes;
    auto io = AlignedBuffer::allocate_for_io(kBytes, /*zero_fill=*/true);
    ASSERT_TRUE(io.has_value()) << io.status().to_string();
    EXPECT_TRUE(is_aligned(io->data(), kHugePageBytes));
    ASSERT_EQ(io->size(), kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) ASSERT_EQ(io->data()[i], std::byte{0}) << i;

    if (!transparent_huge_pages_available()) {
        GTEST_SKIP() << "transparent huge pages are off here (" << thp_mode() << ")";
    }
    auto huge = huge_page_bytes_backing(io->span());
    ASSERT_TRUE(huge.has_value()) << huge.status().to_string();
    // The kernel may fall back to small pages for part of it when memory is fragmented; at
    // least one whole huge page of the eight must be there.
    EXPECT_GE(*huge, kHugePageBytes) << "THP mode: " << thp_mode();

    if (thp_mode().find("[madvise]") != std::string::npos) {
        // Where only advised regions get huge pages, a plain buffer of the same size gets none:
        // the huge pages above are the advice's doing.
        // (A fresh mapping of its own, so that no earlier advice on reused heap memory counts.)
        void* plain =
            ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(plain, MAP_FAILED);
        std::memset(plain, 1, kBytes);
        auto none = huge_page_bytes_backing({static_cast<const std::byte*>(plain), kBytes});
        ::munmap(plain, kBytes);
        ASSERT_TRUE(none.has_value());
        EXPECT_EQ(*none, 0u);
    }
}

TEST(AlignedBuffer, AdviseHugePagesCoversOnlyWholeAlignedHugePages) {
    auto buffer = AlignedBuffer::allocate(4 * kHugePageBytes, kHugePageBytes);
    ASSERT_TRUE(buffer.has_value());
    std::span<std::byte> all = buffer->span();
    // Starting one page in and ending one page short: the first and last huge pages are partial.
    const std::size_t advised =
        advise_huge_pages(all.subspan(kPageBytes, all.size() - 2 * kPageBytes));
    if (advised == 0) GTEST_SKIP() << "madvise(MADV_HUGEPAGE) refused here";
    EXPECT_EQ(advised, 2 * kHugePageBytes);
    EXPECT_EQ(advise_huge_pages(all.subspan(0, kHugePageBytes - kPageBytes)), 0u);
    EXPECT_EQ(advise_huge_pages({}), 0u);
}

}  // namespace
}  // namespace zinf
