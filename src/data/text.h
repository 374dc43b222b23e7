// Byte-level text for a GPT language model: reading a UTF-8 corpus (a file, or a directory of
// them such as the Debian package `fortunes`), cutting it into next-byte windows split
// deterministically into training and validation, and the byte entropies that bound the loss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/data/dataset.h"

namespace zinf::data {

inline constexpr const char* kFortunesDirectory = "/usr/share/games/fortunes";
inline constexpr const char* kFortunesPackageHint =
    "install the Debian package: apt-get install fortunes";
// One token per byte value.
inline constexpr std::size_t kByteVocabularySize = 256;
// Window w of the corpus goes to validation when w % kTextValidationPeriod ==
// kTextValidationPeriod - 1 (every 10th window: a 90/10 split spread over the whole corpus, so
// both sides see every source file).
inline constexpr std::size_t kTextValidationPeriod = 10;

// The length of the longest prefix of `text` that is strict UTF-8 (RFC 3629 / Unicode Table
// 3-7): no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no sequence
// cut by the end. Equals text.size() for valid text; otherwise it is the byte offset of the
// first bad sequence. Allocates nothing.
std::size_t utf8_valid_prefix_bytes(std::string_view text) noexcept;

// Reads the text at `path`, a UTF-8 file or a directory:
// - a directory: its regular files sorted by name (byte order), skipping names ending in
//   ".dat" and everything that is not a regular file; symbolic links are not followed (so the
//   fortunes package's NAME.u8 links to NAME are not read twice), nor are subdirectories;
// - a file with a sibling "<file>.dat" (strfile's index) is in fortune format: every line
//   consisting exactly of "%" (the cookie separators, including a final one) is removed, and
//   every kept line ends with '\n' (one is added to a last line without it), so the cookies
//   follow one another each as its own text; other files are taken byte for byte.
// The texts are concatenated in name order. `path` itself may be a symbolic link.
// Errors: kNotFound naming the path (with kFortunesPackageHint when it is kFortunesDirectory);
// kInvalidArgument naming the file and the byte offset of its first byte that is not strict
// UTF-8 (an offset in the file as stored); kInvalidArgument naming `path` when it holds no
// text at all; kIo (with errno) naming the file or directory that could not be read.
// Allocates the corpus; blocks on reads.
Result<std::string> read_text_corpus(const std::string& path);

struct TextOptions {
    std::string path = kFortunesDirectory;  // a file or a directory, as read_text_corpus
    std::size_t seq_len = 128;              // tokens (bytes) per sample: the config's model.seq_len
};

// Natural-log entropies of a byte sequence, in nats per byte.
struct ByteEntropy {
    // H(X) = -sum_a p(a) ln p(a), p the byte frequencies: the cross-entropy a model that knows
    // only byte frequencies reaches.
    double unigram_nats = 0;
    // H(X_{t+1} | X_t) = -sum_{a,b} p(a,b) ln(p(a,b) / p(a)) over the adjacent pairs (a, b),
    // p(a) the frequency of a as a pair's first byte: what a model that sees only the previous
    // byte reaches. A GPT's loss should fall below it, and an untrained one starts near ln 256.
    double bigram_nats = 0;
};

// The byte entropies of `text` (zeros for fewer than 1 byte, or fewer than 2 for the bigram).
// Counts in doubles; allocates one table of 256 x 256 + 256 counts per call, nothing per byte.
ByteEntropy byte_entropy(std::string_view text);

// Next-byte samples of a corpus: sample i is the window of seq_len + 1 bytes starting at
// starts[i]; its tokens are bytes [start, start + seq_len) and its labels bytes
// [start + 1, start + seq_len + 1), each an int32 in [0, 255] (the byte as unsigned char).
// A token source: gather() asserts, read it with gather_tokens().
class TextDataset final : public DataSource {
public:
    // `corpus` is shared with the other datasets cut from the same text (the training and
    // validation splits): it is read-only and lives as long as the last of them. Preconditions
    // (asserted): seq_len > 0, starts strictly increasing, start + seq_len + 1 <= corpus size.
    TextDataset(std::shared_ptr<const std::string> corpus, std::size_t seq_len,
                std::vector<std::size_t> starts);

    std::size_t count() const noexcept override { return starts_.size(); }
    std::size_t features() const noexcept override { return seq_len_; }
    std::size_t classes() const noexcept override { return kByteVocabularySize; }
    bool token_inputs() const noexcept override { return true; }
    std::size_t label_numel() const noexcept override { return seq_len_; }
    // Asserts: a text dataset has no fp32 features.
    void gather(std::span<const std::uint32_t> indices, std::span<float> inputs,
                std::span<std::int32_t> labels) const override;
    void gather_tokens(std::span<const std::uint32_t> indices, std::span<std::int32_t> tokens,
                       std::span<std::int32_t> labels) const override;

    std::size_t seq_len() const noexcept { return seq_len_; }
    // Bytes of one window: seq_len + 1 (the labels reach one byte past the tokens).
    std::size_t window_bytes() const noexcept { return seq_len_ + 1; }
    // Distinct corpus bytes the windows cover (the union of their ranges; adjacent windows
    // share one byte, so this is less than count() x window_bytes()).
    std::size_t covered_bytes() const noexcept { return covered_bytes_; }
    // The window start offsets, one per sample.
    std::span<const std::size_t> starts() const noexcept { return starts_; }
    const std::string& corpus() const noexcept { return *corpus_; }
    // byte_entropy over the union of the windows' bytes: each maximal run of overlapping
    // windows counts as one text, so a byte or pair two windows share counts once, and a pair
    // no window holds (across a gap, or where two windows merely touch) not at all. For a
    // split of load_text: the bytes of its windows, seen once. Allocates as byte_entropy.
    ByteEntropy entropy() const;

private:
    std::shared_ptr<const std::string> corpus_;
    std::size_t seq_len_;
    std::vector<std::size_t> starts_;
    std::size_t covered_bytes_ = 0;
};

struct TextSplit {
    std::unique_ptr<TextDataset> train;
    std::unique_ptr<TextDataset> validation;
    std::size_t corpus_bytes = 0;
    std::string path;  // options.path, for messages
};

// Reads options.path (read_text_corpus) and cuts it into windows of seq_len + 1 bytes starting
// at w x seq_len for w in [0, (corpus bytes - 1) / seq_len): each window's last byte is the
// next one's first, so every byte but the first is a label exactly once (bytes after the last
// whole window are unused). Window w goes to validation when w % 10 == 9 and to training
// otherwise; with fewer than 10 windows the last one is validation instead. The split depends
// only on the corpus and seq_len. Errors: those of read_text_corpus; kInvalidArgument naming
// model.seq_len for seq_len 0, or for a corpus of fewer than 2 x seq_len + 1 bytes (two
// windows: one for training, one for validation), naming the path and its size.
Result<TextSplit> load_text(const TextOptions& options);

}  // namespace zinf::data
