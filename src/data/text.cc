// The text corpus reader (files, directories, fortune format, strict UTF-8), the next-byte
// windows of TextDataset with their train/validation split, and byte entropies.
#include "src/data/text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "src/base/file.h"
#include "src/base/log.h"

namespace zinf::data {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kStrfileIndexSuffix = ".dat";
constexpr std::string_view kFortuneSeparator = "%";
// A read() that keeps returning EINTR is retried this often before it counts as an error.
constexpr int kReadInterruptsMax = 100;

bool ends_with(std::string_view text, std::string_view suffix) noexcept {
    return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// `path` without trailing slashes, so "/usr/share/games/fortunes/" is recognised too.
std::string_view without_trailing_slashes(std::string_view path) noexcept {
    while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
    return path;
}

Status not_found(const std::string& path, int err) {
    std::string message = str_cat(path, ": ", std::strerror(err));
    if (without_trailing_slashes(path) == kFortunesDirectory) {
        message += str_cat(" (", kFortunesPackageHint, ")");
    }
    return Status::not_found(std::move(message), err);
}

// Appends the whole content of the file at `path` to `out`. Errors: kNotFound, kIo naming it.
Status read_whole_file(const std::string& path, std::string& out) {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
        const int err = errno;
        if (err == ENOENT) return not_found(path, err);
        return Status::io_error(str_cat("opening ", path, ": ", std::strerror(err)), err);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) == 0 && st.st_size > 0) {
        out.reserve(out.size() + static_cast<std::size_t>(st.st_size));
    }
    // Read until end of file rather than trusting st_size: the file may change under us, and
    // a short count would otherwise silently cut the text.
    std::array<char, 1 << 16> chunk{};
    int interrupts = 0;
    for (;;) {
        const ssize_t got = ::read(fd.get(), chunk.data(), chunk.size());
        if (got < 0) {
            const int err = errno;
            if (err == EINTR && ++interrupts <= kReadInterruptsMax) continue;
            return Status::io_error(
                str_cat("reading ", path, " at byte ", out.size(), ": ", std::strerror(err)), err);
        }
        if (got == 0) return Status::ok();
        out.append(chunk.data(), static_cast<std::size_t>(got));
    }
}

// Appends the lines of a fortune file except the "%" separators, each ending with '\n'.
void append_fortune_text(std::string_view raw, std::string& out) {
    std::size_t pos = 0;
    while (pos < raw.size()) {
        const std::size_t newline = raw.find('\n', pos);
        const std::size_t end = newline == std::string_view::npos ? raw.size() : newline;
        const std::string_view line = raw.substr(pos, end - pos);
        if (line != kFortuneSeparator) {
            out.append(line);
            out.push_back('\n');
        }
        pos = end + 1;
    }
}

// Reads one file, checks it is UTF-8, and appends its text (fortune format or verbatim).
Status append_text_file(const std::string& path, bool fortune_format, std::string& corpus) {
    std::string raw;
    ZINF_TRY(read_whole_file(path, raw));
    const std::size_t valid_bytes = utf8_valid_prefix_bytes(raw);
    if (valid_bytes != raw.size()) {
        return Status::invalid_argument(str_cat(path, ": not valid UTF-8 at byte offset ",
                                                valid_bytes, " (byte 0x", std::hex,
                                                int{static_cast<unsigned char>(raw[valid_bytes])},
                                                std::dec, "); the text corpus must be UTF-8"));
    }
    if (fortune_format) {
        append_fortune_text(raw, corpus);
    } else {
        corpus.append(raw);
    }
    return Status::ok();
}

// The names of the regular files to read from `directory`, sorted, each with whether it is in
// fortune format. Symbolic links are neither followed nor read.
struct DirectoryFile {
    std::string name;
    bool fortune_format = false;
};

Result<std::vector<DirectoryFile>> list_text_files(const std::string& directory) {
    std::vector<std::string> names;    // every entry: a ".dat" sibling marks the fortune format
    std::vector<std::string> regular;  // the candidates
    std::error_code ec;
    fs::directory_iterator it(directory, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
        std::string name = it->path().filename().string();
        const fs::file_status status = it->symlink_status(ec);
        if (ec) break;
        if (status.type() == fs::file_type::regular && !ends_with(name, kStrfileIndexSuffix)) {
            regular.push_back(name);
        }
        names.push_back(std::move(name));
    }
    if (ec) {
        return Status::io_error(str_cat("listing ", directory, ": ", ec.message()), ec.value());
    }
    std::sort(names.begin(), names.end());
    std::sort(regular.begin(), regular.end());
    std::vector<DirectoryFile> files;
    files.reserve(regular.size());
    for (std::string& name : regular) {
        const bool fortune =
            std::binary_search(names.begin(), names.end(), str_cat(name, kStrfileIndexSuffix));
        files.push_back(DirectoryFile{std::move(name), fortune});
    }
    return files;
}

// Byte and adjacent-pair counts, in doubles (exact up to 2^53 bytes).
class ByteCounts {
public:
    ByteCounts() : pairs_(kByteVocabularySize * kByteVocabularySize, 0.0) {}

    // Counts the bytes of `run` and its adjacent pairs (none across two runs).
    void add_run(std::string_view run) noexcept {
        for (std::size_t i = 0; i < run.size(); ++i) {
            const auto a = static_cast<unsigned char>(run[i]);
            bytes_[a] += 1.0;
            if (i + 1 < run.size()) {
                const auto b = static_cast<unsigned char>(run[i + 1]);
                pairs_[std::size_t{a} * kByteVocabularySize + b] += 1.0;
            }
        }
    }

    ByteEntropy entropy() const noexcept {
        ByteEntropy result;
        double byte_total = 0;
        for (const double c : bytes_) byte_total += c;
        if (byte_total > 0) {
            for (const double c : bytes_) {
                if (c > 0) result.unigram_nats -= (c / byte_total) * std::log(c / byte_total);
            }
        }
        double pair_total = 0;
        for (const double c : pairs_) pair_total += c;
        if (pair_total > 0) {
            for (std::size_t a = 0; a < kByteVocabularySize; ++a) {
                const double* row = pairs_.data() + a * kByteVocabularySize;
                double first_total = 0;  // count of a as a pair's first byte
                for (std::size_t b = 0; b < kByteVocabularySize; ++b) first_total += row[b];
                for (std::size_t b = 0; b < kByteVocabularySize; ++b) {
                    if (row[b] > 0) {
                        result.bigram_nats -=
                            (row[b] / pair_total) * std::log(row[b] / first_total);
                    }
                }
            }
        }
        // -sum p ln p rounds to a tiny negative value when one symbol has all the mass.
        result.unigram_nats = std::max(result.unigram_nats, 0.0);
        result.bigram_nats = std::max(result.bigram_nats, 0.0);
        return result;
    }

private:
    std::array<double, kByteVocabularySize> bytes_{};
    std::vector<double> pairs_;  // [a * 256 + b]: count of the pair (a, b)
};

// "2 x seq_len + 1" as a number, or as that formula where it would overflow.
std::string two_windows_bytes(std::size_t seq_len) {
    if (seq_len <= (std::numeric_limits<std::size_t>::max() - 1) / 2) {
        return str_cat(2 * seq_len + 1);
    }
    return str_cat("2 x ", seq_len, " + 1");
}

}  // namespace

// ---- UTF-8 -----------------------------------------------------------------------------------

std::size_t utf8_valid_prefix_bytes(std::string_view text) noexcept {
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
    const std::size_t size = text.size();
    std::size_t i = 0;
    while (i < size) {
        const unsigned char lead = bytes[i];
        if (lead < 0x80) {
            ++i;
            continue;
        }
        // Unicode Table 3-7: the lead byte fixes the length and the range of the second byte
        // (which is what excludes overlongs, surrogates and code points above U+10FFFF); any
        // further bytes are 80..BF.
        std::size_t length = 0;
        unsigned char second_min = 0x80;
        unsigned char second_max = 0xBF;
        if (lead >= 0xC2 && lead <= 0xDF) {
            length = 2;
        } else if (lead == 0xE0) {
            length = 3;
            second_min = 0xA0;  // below: overlong
        } else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) {
            length = 3;
        } else if (lead == 0xED) {
            length = 3;
            second_max = 0x9F;  // above: surrogates U+D800..U+DFFF
        } else if (lead == 0xF0) {
            length = 4;
            second_min = 0x90;  // below: overlong
        } else if (lead >= 0xF1 && lead <= 0xF3) {
            length = 4;
        } else if (lead == 0xF4) {
            length = 4;
            second_max = 0x8F;  // above: beyond U+10FFFF
        } else {
            return i;  // 80..C1 (continuation or overlong lead) or F5..FF
        }
        if (size - i < length) return i;  // cut by the end of the text
        if (bytes[i + 1] < second_min || bytes[i + 1] > second_max) return i;
        for (std::size_t k = 2; k < length; ++k) {
            if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
        }
        i += length;
    }
    return size;
}

// ---- Corpus ----------------------------------------------------------------------------------

Result<std::string> read_text_corpus(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) return not_found(path, err);
        return Status::io_error(str_cat("stat ", path, ": ", std::strerror(err)), err);
    }
    std::string corpus;
    if (S_ISDIR(st.st_mode)) {
        ZINF_ASSIGN_OR_RETURN(std::vector<DirectoryFile> files, list_text_files(path));
        const std::string_view directory = without_trailing_slashes(path);
        for (const DirectoryFile& file : files) {
            ZINF_TRY(
                append_text_file(str_cat(directory, "/", file.name), file.fortune_format, corpus));
        }
    } else {
        // A lone file: the fortune format is recognised the same way, by its strfile index.
        struct stat index_st {};
        const std::string index_path = str_cat(path, kStrfileIndexSuffix);
        const bool fortune = ::lstat(index_path.c_str(), &index_st) == 0;
        ZINF_TRY(append_text_file(path, fortune, corpus));
    }
    if (corpus.empty()) {
        return Status::invalid_argument(
            str_cat(path, ": the text corpus is empty (",
                    S_ISDIR(st.st_mode) ? "no regular file with text" : "no text", ")"));
    }
    return corpus;
}

// ---- Entropy ---------------------------------------------------------------------------------

ByteEntropy byte_entropy(std::string_view text) {
    ByteCounts counts;
    counts.add_run(text);
    return counts.entropy();
}

// ---- TextDataset -----------------------------------------------------------------------------

TextDataset::TextDataset(std::shared_ptr<const std::string> corpus, std::size_t seq_len,
                         std::vector<std::size_t> starts)
    : corpus_(std::move(corpus)), seq_len_(seq_len), starts_(std::move(starts)) {
    ZINF_ASSERT(corpus_ != nullptr);
    ZINF_ASSERT_GT(seq_len_, 0u);
    ZINF_ASSERT_LT(seq_len_, std::numeric_limits<std::size_t>::max());
    std::size_t covered_end = 0;
    for (std::size_t i = 0; i < starts_.size(); ++i) {
        if (i > 0) ZINF_ASSERT_LT(starts_[i - 1], starts_[i]);
        ZINF_ASSERT_LT(starts_[i], corpus_->size());
        ZINF_ASSERT_LE(window_bytes(), corpus_->size() - starts_[i]);
        const std::size_t end = starts_[i] + window_bytes();
        covered_bytes_ += end - std::max(starts_[i], covered_end);
        covered_end = end;  // starts increase, so ends do too
    }
}

void TextDataset::gather(std::span<const std::uint32_t> /*indices*/, std::span<float> /*inputs*/,
                         std::span<std::int32_t> /*labels*/) const {
    ZINF_ASSERT_MSG(false,
                    "TextDataset::gather: a text dataset has tokens, not fp32 features; "
                    "use gather_tokens (Batcher::fill_tokens)");
}

void TextDataset::gather_tokens(std::span<const std::uint32_t> indices,
                                std::span<std::int32_t> tokens,
                                std::span<std::int32_t> labels) const {
    ZINF_ASSERT_EQ(tokens.size(), indices.size() * seq_len_);
    ZINF_ASSERT_EQ(labels.size(), indices.size() * seq_len_);
    const auto* bytes = reinterpret_cast<const unsigned char*>(corpus_->data());
    for (std::size_t r = 0; r < indices.size(); ++r) {
        const std::size_t index = indices[r];
        ZINF_ASSERT_LT(index, starts_.size());
        // Through unsigned char: a UTF-8 byte >= 0x80 is a token in 128..255, never negative.
        const unsigned char* window = bytes + starts_[index];
        std::int32_t* token_row = tokens.data() + r * seq_len_;
        std::int32_t* label_row = labels.data() + r * seq_len_;
        for (std::size_t j = 0; j < seq_len_; ++j) {
            token_row[j] = std::int32_t{window[j]};
            label_row[j] = std::int32_t{window[j + 1]};
        }
    }
}

ByteEntropy TextDataset::entropy() const {
    ByteCounts counts;
    const std::string_view text(*corpus_);
    // Runs of overlapping windows count as one text; a run ends where the next window starts at
    // or after its end, so a pair that no window holds is never counted.
    std::size_t run_begin = 0;
    std::size_t run_end = 0;
    for (const std::size_t start : starts_) {
        if (start >= run_end) {
            if (run_end > run_begin) counts.add_run(text.substr(run_begin, run_end - run_begin));
            run_begin = start;
        }
        run_end = start + window_bytes();
    }
    if (run_end > run_begin) counts.add_run(text.substr(run_begin, run_end - run_begin));
    return counts.entropy();
}

// ---- Split -----------------------------------------------------------------------------------

Result<TextSplit> load_text(const TextOptions& options) {
    const std::size_t seq_len = options.seq_len;
    if (seq_len == 0) {
        return Status::invalid_argument(
            str_cat("model.seq_len: must be > 0 for the text at ", options.path, ", got 0"));
    }
    ZINF_ASSIGN_OR_RETURN(std::string text, read_text_corpus(options.path));
    const std::size_t size = text.size();
    // Two windows of seq_len + 1 bytes sharing one byte: one for training, one for validation.
    if (size < 2 || (size - 1) / 2 < seq_len) {
        return Status::invalid_argument(str_cat(
            "model.seq_len: ", seq_len, " needs at least ", two_windows_bytes(seq_len),
            " bytes of text (a training and a validation window of seq_len + 1 bytes, sharing "
            "one byte), but ",
            options.path, " holds only ", size, " bytes"));
    }
    const std::size_t window_count = (size - 1) / seq_len;
    ZINF_ASSERT_GE(window_count, 2u);
    std::vector<std::size_t> train_starts;
    std::vector<std::size_t> validation_starts;
    train_starts.reserve(window_count - window_count / kTextValidationPeriod);
    validation_starts.reserve(window_count / kTextValidationPeriod + 1);
    for (std::size_t w = 0; w < window_count; ++w) {
        const bool validation = w % kTextValidationPeriod == kTextValidationPeriod - 1;
        (validation ? validation_starts : train_starts).push_back(w * seq_len);
    }
    if (validation_starts.empty()) {
        // Fewer than 10 windows: the last one validates, the others (at least one) train.
        validation_starts.push_back(train_starts.back());
        train_starts.pop_back();
    }
    ZINF_ASSERT(!train_starts.empty());
    ZINF_ASSERT_EQ(train_starts.size() + validation_starts.size(), window_count);
    ZINF_ASSERT_LE((window_count - 1) * seq_len + seq_len + 1, size);  // the last window fits

    // Shared by the two datasets, which the caller may keep or drop independently.
    auto corpus = std::make_shared<const std::string>(std::move(text));
    TextSplit split;
    split.train = std::make_unique<TextDataset>(corpus, seq_len, std::move(train_starts));
    split.validation = std::make_unique<TextDataset>(corpus, seq_len, std::move(validation_starts));
    split.corpus_bytes = size;
    split.path = options.path;
    return split;
}

}  // namespace zinf::data
