// The text corpus reader (fortune format, name order, skipped .dat files and links, strict
// UTF-8, errors naming the culprit), the train/validation windows of load_text, gather_tokens
// and Batcher::fill_tokens, byte entropies on known answers, and the real fortunes corpus.
#include "src/data/text.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "src/data/batcher.h"
#include "tests/support/test_seed.h"

namespace zinf::data {
namespace {

void write_file(const std::string& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(out.good()) << path;
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

// ---- Corpus reading --------------------------------------------------------------------------

TEST(TextCorpus, DirectoryDropsSeparatorsSkipsIndexesAndLinksAndKeepsNameOrder) {
    test::TempDir dir("text");
    // Fortune format (it has a .dat sibling): a "%" line is a separator, but "%x", " %" and a
    // "%" inside a line are text; a last line without '\n' gets one; "%%" lines leave nothing.
    write_file(dir.file("b_cookies"),
               "first cookie\n%\nsecond\n  cookie %\n%\n%\n%x\n %\nlast without newline");
    // strfile's binary index: were it read, its bytes (not UTF-8) would fail the load.
    write_file(dir.file("b_cookies.dat"), std::string("\x00\x00\x00\x02\xff\xfe junk", 11));
    // The package's NAME.u8 links to NAME: following it would read the cookies twice.
    ASSERT_EQ(::symlink("b_cookies", dir.file("b_cookies.u8").c_str()), 0);
    // No .dat sibling: plain text, byte for byte, "%" lines included.
    write_file(dir.file("a_plain"), "plain text\n%\nkept");
    write_file(dir.file("c_plain"), "zz\xc3\xa9\n");  // "zzé"
    // A subdirectory is not read.
    std::filesystem::create_directory(dir.file("d_sub"));
    write_file(dir.file("d_sub/inner"), "never read\n");

    auto corpus = read_text_corpus(dir.path());
    ASSERT_TRUE(corpus.has_value()) << corpus.status().to_string();
    EXPECT_EQ(*corpus,
              std::string("plain text\n%\nkept"
                          "first cookie\nsecond\n  cookie %\n%x\n %\nlast without newline\n"
                          "zz\xc3\xa9\n"));

    // The same file read alone is still recognised as fortune format by its sibling, and a
    // trailing slash on the directory changes nothing.
    auto single = read_text_corpus(dir.file("b_cookies"));
    ASSERT_TRUE(single.has_value()) << single.status().to_string();
    EXPECT_EQ(*single, "first cookie\nsecond\n  cookie %\n%x\n %\nlast without newline\n");
    auto slashed = read_text_corpus(dir.path() + "/");
    ASSERT_TRUE(slashed.has_value()) << slashed.status().to_string();
    EXPECT_EQ(*slashed, *corpus);
}

TEST(TextCorpus, FortuneFileEndingInSeparatorLeavesEachCookieNewlineTerminated) {
    test::TempDir dir("text");
    write_file(dir.file("f"), "A\n%\nB\nC\n%\n");
    write_file(dir.file("f.dat"), "x");
    auto corpus = read_text_corpus(dir.file("f"));
    ASSERT_TRUE(corpus.has_value()) << corpus.status().to_string();
    EXPECT_EQ(*corpus, "A\nB\nC\n");
}

TEST(Utf8, AcceptsStrictUtf8AndFindsTheFirstBadSequence) {
    // Valid: ASCII, 2-, 3- and 4-byte forms at the edges of each range.
    EXPECT_EQ(utf8_valid_prefix_bytes(""), 0u);
    const std::string valid =
        "a\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf"
        "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
    EXPECT_EQ(utf8_valid_prefix_bytes(valid), valid.size());
    struct Case {
        std::string text;
        std::size_t offset;
        const char* why;
    };
    const std::vector<Case> cases = {
        {"hello\xc3", 5, "lone lead byte cut by the end"},
        {std::string("hello\xc3") + "A", 5, "lead byte followed by ASCII"},
        {"ab\x80", 2, "lone continuation byte"},
        {"\xc0\x80", 0, "overlong NUL"},
        {"x\xc1\xbf", 1, "overlong 2-byte"},
        {"xy\xe0\x9f\xbf", 2, "overlong 3-byte"},
        {"xyz\xf0\x8f\xbf\xbf", 3, "overlong 4-byte"},
        {"1234567\xed\xa0\x80", 7, "surrogate U+D800"},
        {"\xed\xbf\xbf", 0, "surrogate U+DFFF"},
        {"\xf4\x90\x80\x80", 0, "above U+10FFFF"},
        {"\xf5\x80\x80\x80", 0, "lead byte F5"},
        {"\xff", 0, "byte FF"},
        {"ok\xe2\x82", 2, "3-byte sequence cut by the end"},
        {"ok\xe2\x82\xac\xe2\x28\xa1", 5, "bad third byte after a good euro sign"},
    };
    for (const Case& c : cases) {
        EXPECT_EQ(utf8_valid_prefix_bytes(c.text), c.offset) << c.why;
    }
}

TEST(TextCorpus, RejectsNonUtf8NamingTheFileAndOffset) {
    test::TempDir dir("text");
    struct Case {
        const char* name;
        std::string bytes;
        const char* offset;
    };
    const std::vector<Case> cases = {
        {"lone_c3", "hello\xc3 world", "offset 5"},
        {"overlong", "abc\xc0\x80", "offset 3"},
        {"surrogate", "1234567\xed\xa0\x80 tail", "offset 7"},
    };
    for (const Case& c : cases) {
        write_file(dir.file(c.name), c.bytes);
        auto corpus = read_text_corpus(dir.file(c.name));
        ASSERT_FALSE(corpus.has_value()) << c.name;
        EXPECT_EQ(corpus.error().code(), StatusCode::kInvalidArgument) << c.name;
        EXPECT_TRUE(contains(corpus.error().message(), dir.file(c.name)))
            << corpus.error().message();
        EXPECT_TRUE(contains(corpus.error().message(), c.offset)) << corpus.error().message();
    }
    // Inside a directory, the bad file is named, not just the directory; the offset is in the
    // file as stored, even for a fortune file whose separators are dropped.
    test::TempDir tree("text");
    write_file(tree.file("a"), "good text\n");
    write_file(tree.file("b"), "%\nab\xed\xa0\x80");
    write_file(tree.file("b.dat"), "");
    auto corpus = read_text_corpus(tree.path());
    ASSERT_FALSE(corpus.has_value());
    EXPECT_EQ(corpus.error().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(corpus.error().message(), tree.file("b") + ":"))
        << corpus.error().message();
    EXPECT_TRUE(contains(corpus.error().message(), "offset 4")) << corpus.error().message();
}

TEST(TextCorpus, EmptyOrMissingInputsNameThePath) {
    test::TempDir dir("text");
    write_file(dir.file("empty"), "");
    auto empty_file = read_text_corpus(dir.file("empty"));
    ASSERT_FALSE(empty_file.has_value());
    EXPECT_EQ(empty_file.error().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(empty_file.error().message(), dir.file("empty")));

    // A fortune file of separators only holds no text either.
    write_file(dir.file("seps"), "%\n%\n");
    write_file(dir.file("seps.dat"), "");
    auto separators = read_text_corpus(dir.file("seps"));
    ASSERT_FALSE(separators.has_value());
    EXPECT_EQ(separators.error().code(), StatusCode::kInvalidArgument);

    // A directory with no regular text file: the .dat files and links do not count.
    test::TempDir empty_dir("text");
    auto nothing = read_text_corpus(empty_dir.path());
    ASSERT_FALSE(nothing.has_value());
    EXPECT_EQ(nothing.error().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(nothing.error().message(), empty_dir.path()));
    write_file(empty_dir.file("x.dat"), "index");
    write_file(dir.file("target"), "text behind a link\n");
    ASSERT_EQ(::symlink(dir.file("target").c_str(), empty_dir.file("link").c_str()), 0);
    auto only_links = read_text_corpus(empty_dir.path());
    ASSERT_FALSE(only_links.has_value());
    EXPECT_EQ(only_links.error().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(only_links.error().message(), empty_dir.path()));

    auto missing = read_text_corpus(dir.file("no-such-corpus"));
    ASSERT_FALSE(missing.has_value());
    EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
    EXPECT_TRUE(contains(missing.error().message(), dir.file("no-such-corpus")));
    EXPECT_FALSE(contains(missing.error().message(), "apt-get"));
    if (!std::filesystem::exists(kFortunesDirectory)) {
        auto fortunes = read_text_corpus(kFortunesDirectory);
        ASSERT_FALSE(fortunes.has_value());
        EXPECT_EQ(fortunes.error().code(), StatusCode::kNotFound);
        EXPECT_TRUE(contains(fortunes.error().message(), "apt-get install fortunes"));
    }
}

// ---- Windows and the split -------------------------------------------------------------------

// Valid UTF-8 with bytes >= 0x80 ("é" is C3 A9) at varying positions.
std::string mixed_text(std::size_t size_bytes) {
    std::string text;
    std::uint32_t state = 12345;
    while (text.size() < size_bytes) {
        state = state * 1664525u + 1013904223u;
        const std::uint32_t pick = (state >> 24) % 8;
        if (pick == 0 && text.size() + 2 <= size_bytes) {
            text += "\xc3\xa9";
        } else {
            text.push_back(static_cast<char>('a' + (state >> 16) % 26));
        }
    }
    return text;
}

TEST(TextSplit, SeqLenZeroOrTooLargeIsAnErrorNamingTheKeyAndPath) {
    test::TempDir dir("text");
    write_file(dir.file("t"), std::string(21, 'x'));
    TextOptions options;
    options.path = dir.file("t");
    options.seq_len = 0;
    auto zero = load_text(options);
    ASSERT_FALSE(zero.has_value());
    EXPECT_EQ(zero.error().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(zero.error().message(), "model.seq_len"));
    // 21 bytes hold two windows of 11 bytes (sharing one) for seq_len 10, not for 11.
    options.seq_len = 11;
    auto large = load_text(options);
    ASSERT_FALSE(large.has_value());
    EXPECT_EQ(large.error().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(large.error().message(), "model.seq_len: 11")) << large.error().message();
    EXPECT_TRUE(contains(large.error().message(), dir.file("t"))) << large.error().message();
    EXPECT_TRUE(contains(large.error().message(), "21 bytes")) << large.error().message();
    options.seq_len = 1000000;
    EXPECT_FALSE(load_text(options).has_value());
    options.seq_len = 10;
    auto fits = load_text(options);
    ASSERT_TRUE(fits.has_value()) << fits.status().to_string();
    EXPECT_EQ(fits->train->count(), 1u);
    EXPECT_EQ(fits->validation->count(), 1u);
    EXPECT_EQ(fits->validation->starts()[0], 10u);
}

TEST(TextSplit, EveryTenthWindowValidatesDisjointlyAndDeterministically) {
    test::TempDir dir("text");
    const std::string text = mixed_text(1000);
    write_file(dir.file("corpus.txt"), text);
    TextOptions options;
    options.path = dir.file("corpus.txt");
    options.seq_len = 7;
    auto split = load_text(options);
    ASSERT_TRUE(split.has_value()) << split.status().to_string();
    EXPECT_EQ(split->corpus_bytes, 1000u);
    EXPECT_EQ(split->path, options.path);
    const std::size_t windows = 999 / 7;  // 142
    EXPECT_EQ(split->train->count() + split->validation->count(), windows);
    EXPECT_EQ(split->validation->count(), 14u);  // w = 9, 19, ..., 139
    EXPECT_EQ(split->train->count(), 128u);

    std::set<std::size_t> train(split->train->starts().begin(), split->train->starts().end());
    std::set<std::size_t> validation(split->validation->starts().begin(),
                                     split->validation->starts().end());
    EXPECT_EQ(train.size(), split->train->count());
    for (const std::size_t start : validation) {
        EXPECT_EQ(train.count(start), 0u) << start;
        EXPECT_EQ(start % 7, 0u);
        EXPECT_EQ((start / 7) % 10, 9u) << start;
    }
    for (const std::size_t start : train) {
        EXPECT_EQ(start % 7, 0u);
        EXPECT_NE((start / 7) % 10, 9u) << start;
        EXPECT_LT(start / 7, windows);
    }
    // Training: runs of 9 windows of 8 bytes sharing a byte: 9 x 7 + 1 = 64 bytes each, 14
    // full runs (w 0..139) plus w 140, 141 (15 bytes); validation windows never touch.
    EXPECT_EQ(split->train->covered_bytes(), 14u * 64u + 15u);
    EXPECT_EQ(split->validation->covered_bytes(), 14u * 8u);

    auto again = load_text(options);
    ASSERT_TRUE(again.has_value());
    EXPECT_TRUE(std::ranges::equal(again->train->starts(), split->train->starts()));
    EXPECT_TRUE(std::ranges::equal(again->validation->starts(), split->validation->starts()));

    // gather_tokens: tokens are the corpus bytes as unsigned values, labels shifted by one.
    for (const TextDataset* dataset : {split->train.get(), split->validation.get()}) {
        EXPECT_TRUE(dataset->token_inputs());
        EXPECT_EQ(dataset->features(), 7u);
        EXPECT_EQ(dataset->label_numel(), 7u);
        EXPECT_EQ(dataset->classes(), 256u);
        std::vector<std::uint32_t> indices(dataset->count());
        for (std::size_t i = 0; i < indices.size(); ++i) {
            indices[i] = static_cast<std::uint32_t>(indices.size() - 1 - i);  // any order
        }
        std::vector<std::int32_t> tokens(indices.size() * 7);
        std::vector<std::int32_t> labels(indices.size() * 7);
        dataset->gather_tokens(indices, tokens, labels);
        bool saw_high_byte = false;
        for (std::size_t r = 0; r < indices.size(); ++r) {
            const std::size_t start = dataset->starts()[indices[r]];
            for (std::size_t j = 0; j < 7; ++j) {
                const std::int32_t token = tokens[r * 7 + j];
                ASSERT_GE(token, 0);
                ASSERT_LE(token, 255);
                ASSERT_EQ(token, static_cast<unsigned char>(text[start + j]));
                ASSERT_EQ(labels[r * 7 + j], static_cast<unsigned char>(text[start + j + 1]));
                if (j + 1 < 7) {
                    ASSERT_EQ(labels[r * 7 + j], tokens[r * 7 + j + 1]);
                }
                saw_high_byte = saw_high_byte || token >= 0x80;
            }
        }
        EXPECT_TRUE(saw_high_byte);
    }
}

TEST(TextSplit, FewerThanTenWindowsValidateOnTheLast) {
    test::TempDir dir("text");
    write_file(dir.file("short"), mixed_text(41));  // (41 - 1) / 8 = 5 windows of seq_len 8
    TextOptions options;
    options.path = dir.file("short");
    options.seq_len = 8;
    auto split = load_text(options);
    ASSERT_TRUE(split.has_value()) << split.status().to_string();
    EXPECT_TRUE(std::ranges::equal(split->train->starts(), std::vector<std::size_t>{0, 8, 16, 24}));
    EXPECT_TRUE(std::ranges::equal(split->validation->starts(), std::vector<std::size_t>{32}));
}

TEST(TextDataset, FillTokensGivesTheRowsOfGatherTokensForEachBatch) {
    auto corpus = std::make_shared<const std::string>(mixed_text(500));
    std::vector<std::size_t> starts;
    for (std::size_t s = 0; s + 10 <= corpus->size(); s += 9) starts.push_back(s);
    const TextDataset dataset(corpus, 9, starts);
    ASSERT_EQ(dataset.count(), 55u);
    BatcherOptions options;
    options.batch_rows = 4;
    options.drop_last = false;
    options.seed = 7;
    auto batcher = Batcher::create(dataset, options);
    ASSERT_TRUE(batcher.has_value()) << batcher.status().to_string();
    ASSERT_EQ(batcher->batches_per_epoch(), 14u);
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
        batcher->start_epoch(epoch);
        for (std::size_t b = 0; b < batcher->batches_per_epoch(); ++b) {
            // Exactly batch_rows x seq_len each: labels sized by one label per sample would
            // trip gather_tokens' size assertions.
            std::vector<std::int32_t> tokens(4 * 9, -1);
            std::vector<std::int32_t> labels(4 * 9, -1);
            const std::size_t rows = batcher->fill_tokens(b, tokens, labels);
            const auto indices = batcher->batch_indices(b);
            ASSERT_EQ(rows, indices.size());
            ASSERT_EQ(rows, b + 1 < batcher->batches_per_epoch() ? 4u : 3u);
            std::vector<std::int32_t> want_tokens(rows * 9);
            std::vector<std::int32_t> want_labels(rows * 9);
            dataset.gather_tokens(indices, want_tokens, want_labels);
            EXPECT_TRUE(std::equal(want_tokens.begin(), want_tokens.end(), tokens.begin()));
            EXPECT_TRUE(std::equal(want_labels.begin(), want_labels.end(), labels.begin()));
            // Rows past a partial batch are not written.
            EXPECT_TRUE(std::all_of(tokens.begin() + static_cast<std::ptrdiff_t>(rows * 9),
                                    tokens.end(), [](std::int32_t v) { return v == -1; }));
        }
    }
}

TEST(TextDatasetDeathTest, MixingFeatureAndTokenCallsAsserts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto corpus = std::make_shared<const std::string>("abcdefghij");
    const TextDataset text(corpus, 3, {0, 3});
    std::vector<std::uint32_t> index{0};
    std::vector<float> inputs(3);
    std::vector<std::int32_t> labels(3);
    EXPECT_DEATH(text.gather(index, inputs, labels), "gather_tokens");
    auto batcher = Batcher::create(text, BatcherOptions{1, false, true, 1});
    ASSERT_TRUE(batcher.has_value());
    EXPECT_DEATH((void)batcher->fill(0, inputs, labels), "fill_tokens");

    const InMemoryDataset features(3, 2, {1, 2, 3}, {1});
    std::vector<std::int32_t> tokens(3);
    std::vector<std::int32_t> label(1);
    EXPECT_DEATH(features.gather_tokens(index, tokens, label), "without token inputs");
    auto feature_batcher = Batcher::create(features, BatcherOptions{1, false, true, 1});
    ASSERT_TRUE(feature_batcher.has_value());
    EXPECT_DEATH((void)feature_batcher->fill_tokens(0, tokens, label), "use fill");
    // The float path still works for a feature source.
    std::vector<float> row(3);
    ASSERT_EQ(feature_batcher->fill(0, row, label), 1u);
    EXPECT_EQ(row, (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(label[0], 1);
}

// ---- Entropy ---------------------------------------------------------------------------------

TEST(ByteEntropy, KnownAnswers) {
    std::string abab;
    for (int i = 0; i < 500; ++i) abab += "ab";
    const ByteEntropy alternating = byte_entropy(abab);
    EXPECT_NEAR(alternating.unigram_nats, std::log(2.0), 1e-12);
    EXPECT_NEAR(alternating.bigram_nats, 0.0, 1e-12);

    // "abba": bytes a, b twice each -> ln 2. Pairs ab, bb, ba: after a always b (0 nats);
    // after b, b or a evenly (ln 2), b starting 2 of 3 pairs -> (2/3) ln 2.
    const ByteEntropy abba = byte_entropy("abba");
    EXPECT_NEAR(abba.unigram_nats, std::log(2.0), 1e-12);
    EXPECT_NEAR(abba.bigram_nats, 2.0 / 3.0 * std::log(2.0), 1e-12);
    // "aab": p = 2/3, 1/3; pairs aa, ab both after a -> ln 2.
    const ByteEntropy aab = byte_entropy("aab");
    EXPECT_NEAR(aab.unigram_nats,
                -(2.0 / 3.0) * std::log(2.0 / 3.0) - (1.0 / 3.0) * std::log(1.0 / 3.0), 1e-12);
    EXPECT_NEAR(aab.bigram_nats, std::log(2.0), 1e-12);

    const ByteEntropy none = byte_entropy("");
    EXPECT_EQ(none.unigram_nats, 0.0);
    EXPECT_EQ(none.bigram_nats, 0.0);
    const ByteEntropy one = byte_entropy("z");
    EXPECT_EQ(one.unigram_nats, 0.0);
    EXPECT_EQ(one.bigram_nats, 0.0);
    const ByteEntropy constant = byte_entropy(std::string(100, 'q'));
    EXPECT_EQ(constant.unigram_nats, 0.0);
    EXPECT_EQ(constant.bigram_nats, 0.0);
}

// The de Bruijn sequence B(256, 2) (Fredricksen-Maiorana: concatenated Lyndon words), made
// linear by repeating its first byte: every byte value 256 times plus one, and every one of
// the 65536 ordered pairs exactly once.
std::string de_bruijn_bytes() {
    constexpr int k = 256;
    std::string out;
    std::vector<int> a(2 * 2 + 1, 0);
    auto db = [&](auto&& self, int t, int p) -> void {
        if (t > 2) {
            if (2 % p == 0) {
                for (int i = 1; i <= p; ++i) out.push_back(static_cast<char>(a[i]));
            }
            return;
        }
        a[t] = a[t - p];
        self(self, t + 1, p);
        for (int j = a[t - p] + 1; j < k; ++j) {
            a[t] = j;
            self(self, t + 1, t);
        }
    };
    db(db, 1, 1);
    out.push_back(out.front());
    return out;
}

TEST(ByteEntropy, EveryByteAndPairEquallyOftenGivesLn256) {
    const std::string text = de_bruijn_bytes();
    ASSERT_EQ(text.size(), 65537u);
    std::set<int> pairs;
    for (std::size_t i = 0; i + 1 < text.size(); ++i) {
        pairs.insert(static_cast<unsigned char>(text[i]) * 256 +
                     static_cast<unsigned char>(text[i + 1]));
    }
    ASSERT_EQ(pairs.size(), 65536u);
    const ByteEntropy entropy = byte_entropy(text);
    // One byte value occurs 257 times instead of 256: the unigram entropy is below ln 256 by
    // about (1/65537)^2 * 256 / 2, far inside 1e-6. The pairs are exactly uniform.
    EXPECT_NEAR(entropy.unigram_nats, std::log(256.0), 1e-6);
    EXPECT_NEAR(entropy.bigram_nats, std::log(256.0), 1e-9);
}

TEST(ByteEntropy, DatasetEntropyCountsEachWindowByteOnceAndNoPairAcrossGaps) {
    // Windows [0, 4) and [10, 14) of "aaaa......bbbb": a pair (a, b) would exist only across
    // the gap, so the bigram entropy is 0 and the unigram entropy ln 2.
    auto gapped = std::make_shared<const std::string>("aaaaxxxxxxbbbb");
    const TextDataset apart(gapped, 3, {0, 10});
    EXPECT_EQ(apart.covered_bytes(), 8u);
    EXPECT_NEAR(apart.entropy().unigram_nats, std::log(2.0), 1e-12);
    EXPECT_NEAR(apart.entropy().bigram_nats, 0.0, 1e-12);
    // Windows that merely touch ([0, 4) and [4, 8)) hold no pair (a, b) either.
    auto touching = std::make_shared<const std::string>("aaaabbbb");
    const TextDataset touch(touching, 3, {0, 4});
    EXPECT_EQ(touch.covered_bytes(), 8u);
    EXPECT_NEAR(touch.entropy().bigram_nats, 0.0, 1e-12);
    // Overlapping windows (load_text's layout): the union, with its shared bytes once.
    const std::string text = mixed_text(301);
    auto corpus = std::make_shared<const std::string>(text);
    const TextDataset chain(corpus, 10, {0, 10, 20, 30});
    EXPECT_EQ(chain.covered_bytes(), 41u);
    const ByteEntropy want = byte_entropy(std::string_view(text).substr(0, 41));
    EXPECT_NEAR(chain.entropy().unigram_nats, want.unigram_nats, 1e-12);
    EXPECT_NEAR(chain.entropy().bigram_nats, want.bigram_nats, 1e-12);
}

// ---- The real corpus -------------------------------------------------------------------------

TEST(Fortunes, RealCorpusLoadsAndSplits) {
    if (!std::filesystem::is_directory(kFortunesDirectory)) {
        GTEST_SKIP() << kFortunesDirectory << " is absent (" << kFortunesPackageHint << ")";
    }
    auto corpus = read_text_corpus(kFortunesDirectory);
    ASSERT_TRUE(corpus.has_value()) << corpus.status().to_string();
    EXPECT_GT(corpus->size(), 2000000u);
    EXPECT_LT(corpus->size(), 3000000u);
    EXPECT_FALSE(corpus->starts_with("%\n"));
    EXPECT_EQ(corpus->find("\n%\n"), std::string::npos);
    EXPECT_EQ(corpus->back(), '\n');

    TextOptions options;  // the defaults: the fortunes directory, seq_len 128
    auto split = load_text(options);
    ASSERT_TRUE(split.has_value()) << split.status().to_string();
    EXPECT_EQ(split->corpus_bytes, corpus->size());
    EXPECT_EQ(split->train->corpus(), *corpus);
    const std::size_t windows = (corpus->size() - 1) / 128;
    EXPECT_EQ(split->validation->count(), windows / 10);
    EXPECT_EQ(split->train->count(), windows - windows / 10);
    ASSERT_GT(split->train->count(), 0u);
    ASSERT_GT(split->validation->count(), 0u);

    const ByteEntropy whole = byte_entropy(*corpus);
    const ByteEntropy train = split->train->entropy();
    const ByteEntropy validation = split->validation->entropy();
    std::printf(
        "fortunes: %zu bytes of text; seq_len 128: %zu windows, %zu train, %zu validation "
        "(train covers %zu bytes, validation %zu)\n",
        corpus->size(), windows, split->train->count(), split->validation->count(),
        split->train->covered_bytes(), split->validation->covered_bytes());
    std::printf(
        "byte entropy (nats/byte): corpus unigram %.4f bigram %.4f; train unigram %.4f "
        "bigram %.4f; validation unigram %.4f bigram %.4f; ln 256 = %.4f\n",
        whole.unigram_nats, whole.bigram_nats, train.unigram_nats, train.bigram_nats,
        validation.unigram_nats, validation.bigram_nats, std::log(256.0));
    for (const ByteEntropy& e : {whole, train, validation}) {
        EXPECT_GT(e.bigram_nats, 0.0);
        EXPECT_LT(e.bigram_nats, e.unigram_nats);
        EXPECT_LT(e.unigram_nats, std::log(256.0));
    }
}

}  // namespace
}  // namespace zinf::data
