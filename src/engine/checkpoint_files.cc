// Checkpoint directories: temporary name, fsync, atomic rename, manifest with XXH3 checksums;
// every name opened relative to a directory descriptor, never through a symbolic link.
#include "src/engine/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "src/base/file.h"
#include "src/base/log.h"

namespace zinf::engine {
namespace {

constexpr std::size_t kManifestBytesMax = 64u << 20;
constexpr std::string_view kManifestName = "manifest.txt";
constexpr std::string_view kLatestName = "latest";

std::span<const std::byte> bytes_of(const std::string& text) {
    return std::as_bytes(std::span<const char>(text.data(), text.size()));
}

// Creates `name` in `dir` (exclusively: an existing entry, a planted link included, is an
// error), writes `bytes` and fsyncs it.
Status write_new_file(io::FileSystem& fs, const io::Directory& dir, std::string_view name,
                      std::span<const std::byte> bytes) {
    const std::string path = dir.path_of(name);
    ZINF_ASSIGN_OR_RETURN(FileDescriptor fd,
                          fs.open_at(dir, name, O_WRONLY | O_CREAT | O_EXCL, 0600));
    ZINF_TRY(fs.write_all(fd.get(), bytes, path).with_context("checkpoint"));
    return fs.sync(fd.get(), /*data_only=*/false, path).with_context("checkpoint");
}

// Reads the whole of a small file `name` of `dir` (at most `max_bytes`).
Result<std::string> read_small_file(io::FileSystem& fs, const io::Directory& dir,
                                    std::string_view name, std::size_t max_bytes) {
    const std::string path = dir.path_of(name);
    ZINF_ASSIGN_OR_RETURN(FileDescriptor fd, fs.open_at(dir, name, O_RDONLY, 0));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "checkpoint: stat " + path);
    if (!S_ISREG(st.st_mode)) return Status::corruption("checkpoint: " + path + " is not a file");
    if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
        return Status::corruption("checkpoint: " + path + " is " + std::to_string(st.st_size) +
                                  " bytes, more than the " + std::to_string(max_bytes) +
                                  " such a file can be");
    }
    std::string text(static_cast<std::size_t>(st.st_size), '\0');
    ZINF_TRY(fs.read_exact(
        fd.get(), std::as_writable_bytes(std::span<char>(text.data(), text.size())), path));
    return text;
}

std::string hex(std::uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

std::shared_ptr<void> new_hash_state() {
    XXH3_state_t* st = XXH3_createState();
    ZINF_ASSERT(st != nullptr);
    XXH3_64bits_reset(st);
    return std::shared_ptr<void>(st,
                                 [](void* p) { XXH3_freeState(static_cast<XXH3_state_t*>(p)); });
}

}  // namespace

std::uint64_t checksum(std::span<const std::byte> bytes) noexcept {
    return XXH3_64bits(bytes.data(), bytes.size());
}

Status check_tag(const std::string& tag, std::string_view source) {
    bool ok =
        !tag.empty() && tag.size() <= 255 && tag[0] != '.' && tag.find('/') == std::string::npos;
    for (const char c : tag) ok = ok && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
    if (!ok) {
        return Status::invalid_argument(str_cat(
            source, ": checkpoint tag '", tag,
            "': expected a non-empty name of at most 255 bytes, without '/', control characters "
            "or a leading '.'"));
    }
    return Status::ok();
}

Result<std::string> read_latest_tag(io::FileSystem& fs, const std::string& dir) {
    ZINF_ASSIGN_OR_RETURN(io::Directory d, fs.open_directory(dir, /*follow_last=*/true));
    auto text = read_small_file(fs, d, kLatestName, 4096);
    if (!text.has_value()) return text.error();
    std::string tag = *text;
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) {
        tag.pop_back();
    }
    ZINF_TRY(check_tag(tag, d.path_of(kLatestName)));
    return tag;
}

Result<CheckpointWriter> CheckpointWriter::create(io::FileSystem& fs, const std::string& dir,
                                                  const std::string& tag) {
    ZINF_TRY(check_tag(tag, "checkpoint"));
    CheckpointWriter w;
    w.fs_ = &fs;
    ZINF_ASSIGN_OR_RETURN(w.dir_, io::open_trusted_directory(fs, dir, "checkpoint directory",
                                                             /*create=*/true));
    w.tag_ = tag;
    w.temp_name_ = "." + tag + ".tmp." + std::to_string(::getpid());
    // A directory of this name was left by a writer of this pid that died: ours to remove.
    ZINF_TRY(io::remove_tree_at(fs, w.dir_, w.temp_name_));
    ZINF_TRY(fs.make_directory_at(w.dir_, w.temp_name_, 0700).with_context("checkpoint"));
    w.committed_ = false;
    ZINF_ASSIGN_OR_RETURN(w.temp_, fs.open_directory_at(w.dir_, w.temp_name_));
    return w;
}

CheckpointWriter::~CheckpointWriter() {
    if (committed_ || temp_name_.empty() || fs_ == nullptr) return;
    (void)io::remove_tree_at(*fs_, dir_, temp_name_);
}

Status CheckpointWriter::write_file(const std::string& name, std::span<const std::byte> bytes) {
    ZINF_ASSERT(!committed_);
    ZINF_TRY(write_new_file(*fs_, temp_, name, bytes));
    files_.push_back("file " + name + " " + std::to_string(bytes.size()) + " " +
                     hex(checksum(bytes)));
    return Status::ok();
}

Status CheckpointFile::append(std::span<const std::byte> bytes) {
    ZINF_ASSERT(fd_.valid());
    ZINF_TRY(fs_->write_all(fd_.get(), bytes, path_).with_context("checkpoint"));
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_.get()), bytes.data(), bytes.size());
    bytes_ += bytes.size();
    return Status::ok();
}

Status CheckpointFile::read(std::span<std::byte> bytes) {
    ZINF_ASSERT(fd_.valid());
    if (bytes_ + bytes.size() > expected_bytes_) {
        return Status::corruption("checkpoint: " + path_ + ": reading past the " +
                                  std::to_string(expected_bytes_) + " bytes the manifest states");
    }
    Status s = fs_->read_exact(fd_.get(), bytes, path_);
    if (!s.is_ok()) {
        if (s.code() == StatusCode::kCorruption) {
            return Status::corruption("checkpoint: " + path_ +
                                      " is shorter than its manifest says");
        }
        return s.with_context("checkpoint");
    }
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_.get()), bytes.data(), bytes.size());
    bytes_ += bytes.size();
    return Status::ok();
}

Result<CheckpointFile> CheckpointWriter::begin_file(const std::string& name) {
    ZINF_ASSERT(!committed_);
    CheckpointFile f;
    f.fs_ = fs_;
    f.name_ = name;
    f.path_ = temp_.path_of(name);
    ZINF_ASSIGN_OR_RETURN(f.fd_, fs_->open_at(temp_, name, O_WRONLY | O_CREAT | O_EXCL, 0600));
    f.state_ = new_hash_state();
    return f;
}

Status CheckpointWriter::end_file(CheckpointFile& file) {
    ZINF_ASSERT(file.fd_.valid());
    ZINF_TRY(fs_->sync(file.fd_.get(), /*data_only=*/false, file.path_).with_context("checkpoint"));
    files_.push_back("file " + file.name_ + " " + std::to_string(file.bytes_) + " " +
                     hex(XXH3_64bits_digest(static_cast<XXH3_state_t*>(file.state_.get()))));
    file.fd_ = FileDescriptor();
    return Status::ok();
}

Status CheckpointWriter::commit() {
    ZINF_ASSERT(!committed_);
    std::string manifest = "zinfinity-checkpoint 1\n";
    for (const auto& [k, v] : values_) manifest += str_cat(k, " ", v, "\n");
    for (const auto& f : files_) manifest += str_cat(f, "\n");
    ZINF_TRY(write_new_file(*fs_, temp_, kManifestName, bytes_of(manifest)));
    ZINF_TRY(fs_->sync(temp_.fd(), false, temp_.path()).with_context("checkpoint"));
    const std::string old_name = "." + tag_ + ".old." + std::to_string(::getpid());
    struct stat st {};
    const bool replacing = ::fstatat(dir_.fd(), tag_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (replacing) {
        ZINF_TRY(io::remove_tree_at(*fs_, dir_, old_name));
        ZINF_TRY(fs_->rename_at(dir_, tag_, old_name).with_context("checkpoint"));
    }
    if (Status s = fs_->rename_at(dir_, temp_name_, tag_); !s.is_ok()) {
        if (replacing) (void)fs_->rename_at(dir_, old_name, tag_);
        return s.with_context("checkpoint");
    }
    committed_ = true;
    if (replacing) (void)io::remove_tree_at(*fs_, dir_, old_name);
    if (!update_latest_) return fs_->sync(dir_.fd(), false, dir_.path()).with_context("checkpoint");
    // <dir>/latest names the newest tag, as DeepSpeed's does; replaced atomically too (rename
    // replaces a link named `latest` instead of writing through it).
    const std::string latest_tmp = ".latest.tmp." + std::to_string(::getpid());
    ZINF_TRY(io::remove_tree_at(*fs_, dir_, latest_tmp));
    Status pointed = write_new_file(*fs_, dir_, latest_tmp, bytes_of(tag_));
    if (pointed.is_ok()) pointed = fs_->rename_at(dir_, latest_tmp, kLatestName);
    if (!pointed.is_ok()) {
        // The new checkpoint is complete under its tag; `latest` still names the previous one.
        (void)io::remove_tree_at(*fs_, dir_, latest_tmp);
        return pointed.with_context("checkpoint");
    }
    return fs_->sync(dir_.fd(), false, dir_.path()).with_context("checkpoint");
}

Result<CheckpointReader> CheckpointReader::open(io::FileSystem& fs, const std::string& dir,
                                                const std::string& tag) {
    ZINF_TRY(check_tag(tag, "checkpoint"));
    CheckpointReader r;
    r.fs_ = &fs;
    r.path_ = dir + "/" + tag;
    auto parent = fs.open_directory(dir, /*follow_last=*/true);
    if (!parent.has_value()) {
        if (parent.error().code() == StatusCode::kNotFound) {
            return Status::not_found("checkpoint: no directory " + dir);
        }
        return parent.error();
    }
    auto tag_dir = fs.open_directory_at(*parent, tag);
    if (!tag_dir.has_value()) {
        if (tag_dir.error().code() == StatusCode::kNotFound) {
            return Status::not_found("checkpoint: no checkpoint " + r.path_);
        }
        return tag_dir.error();
    }
    r.tag_dir_ = std::move(*tag_dir);
    auto text = read_small_file(fs, r.tag_dir_, kManifestName, kManifestBytesMax);
    if (!text.has_value()) {
        if (text.error().code() == StatusCode::kNotFound) {
            return Status::not_found("checkpoint: no manifest at " + r.path_ + "/manifest.txt");
        }
        return text.error();
    }
    std::istringstream in(*text);
    std::string line;
    if (!std::getline(in, line) || line != "zinfinity-checkpoint 1") {
        return Status::corruption("checkpoint: " + r.path_ + "/manifest.txt: bad header");
    }
    while (std::getline(in, line)) {
        const auto space = line.find(' ');
        if (space == std::string::npos) {
            return Status::corruption("checkpoint: " + r.path_ + "/manifest.txt: bad line '" +
                                      line + "'");
        }
        const std::string key = line.substr(0, space);
        const std::string value = line.substr(space + 1);
        if (key == "file") {
            std::istringstream fields(value);
            std::string name, sum;
            FileEntry e;
            if (!(fields >> name >> e.size_bytes >> sum)) {
                return Status::corruption("checkpoint: bad file line '" + line + "'");
            }
            e.checksum = std::strtoull(sum.c_str(), nullptr, 16);
            r.files_[name] = e;
        } else {
            r.values_[key] = value;
        }
    }
    return r;
}

Result<std::string> CheckpointReader::get(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) {
        return Status::corruption("checkpoint " + path_ + ": manifest lacks '" + key + "'");
    }
    return it->second;
}

Result<std::uint64_t> CheckpointReader::get_u64(const std::string& key) const {
    ZINF_ASSIGN_OR_RETURN(auto s, get(key));
    char* end = nullptr;
    const auto v = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != '\0') {
        return Status::corruption("checkpoint " + path_ + ": '" + key +
                                  "' is not an integer: " + s);
    }
    return static_cast<std::uint64_t>(v);
}

Result<double> CheckpointReader::get_double(const std::string& key) const {
    ZINF_ASSIGN_OR_RETURN(auto s, get(key));
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0') {
        return Status::corruption("checkpoint " + path_ + ": '" + key + "' is not a number: " + s);
    }
    return v;
}

Status CheckpointReader::read_file(const std::string& name, std::span<std::byte> out) const {
    ZINF_ASSIGN_OR_RETURN(CheckpointFile f, open_file(name, out.size()));
    ZINF_TRY(f.read(out));
    return end_file(f);
}

Result<std::uint64_t> CheckpointReader::file_size(const std::string& name) const {
    auto it = files_.find(name);
    if (it == files_.end()) {
        return Status::corruption("checkpoint " + path_ + ": manifest lists no file '" + name +
                                  "'");
    }
    return it->second.size_bytes;
}

Result<CheckpointFile> CheckpointReader::open_file(const std::string& name,
                                                   std::uint64_t size_bytes) const {
    auto it = files_.find(name);
    if (it == files_.end()) {
        return Status::corruption("checkpoint " + path_ + ": manifest lists no file '" + name +
                                  "'");
    }
    if (it->second.size_bytes != size_bytes) {
        return Status::corruption("checkpoint " + path_ + "/" + name + ": " +
                                  std::to_string(it->second.size_bytes) + " bytes, expected " +
                                  std::to_string(size_bytes));
    }
    CheckpointFile f;
    f.fs_ = fs_;
    f.name_ = name;
    f.path_ = path_ + "/" + name;
    ZINF_ASSIGN_OR_RETURN(f.fd_, fs_->open_at(tag_dir_, name, O_RDONLY, 0));
    f.expected_bytes_ = size_bytes;
    f.expected_sum_ = it->second.checksum;
    f.state_ = new_hash_state();
    return f;
}

Status CheckpointReader::end_file(CheckpointFile& file) const {
    ZINF_ASSERT(file.fd_.valid());
    file.fd_ = FileDescriptor();
    if (file.bytes_ != file.expected_bytes_) {
        return Status::corruption("checkpoint: " + file.path_ + ": read " +
                                  std::to_string(file.bytes_) + " of " +
                                  std::to_string(file.expected_bytes_) + " bytes");
    }
    if (XXH3_64bits_digest(static_cast<XXH3_state_t*>(file.state_.get())) != file.expected_sum_) {
        return Status::corruption("checkpoint: " + file.path_ + ": checksum mismatch");
    }
    return Status::ok();
}

}  // namespace zinf::engine
