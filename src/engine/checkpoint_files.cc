// Checkpoint directories: temporary name, fsync, atomic rename, manifest with XXH3 checksums.
#include "src/engine/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/base/file.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;

Status write_all(const std::string& path, std::span<const std::byte> bytes) {
    FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::from_errno(errno, "checkpoint: open " + path);
    std::size_t done = 0;
    // Bounded: every iteration writes at least one byte or returns an error.
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Status::from_errno(errno, "checkpoint: write " + path);
        }
        if (n == 0) return Status::io_error("checkpoint: write " + path + " wrote nothing", EIO);
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) return Status::from_errno(errno, "checkpoint: fsync " + path);
    return Status::ok();
}

Status fsync_directory(const std::string& path) {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Status::from_errno(errno, "checkpoint: open directory " + path);
    if (::fsync(fd.get()) != 0) return Status::from_errno(errno, "checkpoint: fsync " + path);
    return Status::ok();
}

std::string hex(std::uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

}  // namespace

std::uint64_t checksum(std::span<const std::byte> bytes) noexcept {
    return XXH3_64bits(bytes.data(), bytes.size());
}

Result<CheckpointWriter> CheckpointWriter::create(const std::string& dir, const std::string& tag) {
    if (tag.empty() || tag.find('/') != std::string::npos || tag[0] == '.') {
        return Status::invalid_argument("checkpoint tag '" + tag +
                                        "': expected a non-empty name without '/' or leading '.'");
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        return Status::io_error("checkpoint: create directory " + dir + ": " + ec.message(),
                                ec.value());
    ZINF_TRY(check_writable_directory(dir));
    CheckpointWriter w;
    w.dir_ = dir;
    w.tag_ = tag;
    w.temp_path_ = dir + "/." + tag + ".tmp." + std::to_string(::getpid());
    fs::remove_all(w.temp_path_, ec);
    if (::mkdir(w.temp_path_.c_str(), 0700) != 0) {
        return Status::from_errno(errno, "checkpoint: mkdir " + w.temp_path_);
    }
    w.committed_ = false;
    return w;
}

CheckpointWriter::~CheckpointWriter() {
    if (committed_ || temp_path_.empty()) return;
    std::error_code ec;
    fs::remove_all(temp_path_, ec);
}

Status CheckpointWriter::write_file(const std::string& name, std::span<const std::byte> bytes) {
    ZINF_ASSERT(!committed_);
    ZINF_TRY(write_all(temp_path_ + "/" + name, bytes));
    files_.push_back("file " + name + " " + std::to_string(bytes.size()) + " " +
                     hex(checksum(bytes)));
    return Status::ok();
}

namespace {

std::shared_ptr<void> new_hash_state() {
    XXH3_state_t* st = XXH3_createState();
    ZINF_ASSERT(st != nullptr);
    XXH3_64bits_reset(st);
    return std::shared_ptr<void>(st, [](void* p) { XXH3_freeState(static_cast<XXH3_state_t*>(p)); });
}

}  // namespace

Status CheckpointFile::append(std::span<const std::byte> bytes) {
    ZINF_ASSERT(fd_.valid());
    std::size_t done = 0;
    // Bounded: every iteration writes at least one byte or returns an error.
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd_.get(), bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Status::from_errno(errno, "checkpoint: write " + path_);
        }
        if (n == 0) return Status::io_error("checkpoint: write " + path_ + " wrote nothing", EIO);
        done += static_cast<std::size_t>(n);
    }
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
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::read(fd_.get(), bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Status::from_errno(errno, "checkpoint: read " + path_);
        }
        if (n == 0)
            return Status::corruption("checkpoint: " + path_ + " is shorter than its manifest says");
        done += static_cast<std::size_t>(n);
    }
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_.get()), bytes.data(), bytes.size());
    bytes_ += bytes.size();
    return Status::ok();
}

Result<CheckpointFile> CheckpointWriter::begin_file(const std::string& name) {
    ZINF_ASSERT(!committed_);
    CheckpointFile f;
    f.name_ = name;
    f.path_ = temp_path_ + "/" + name;
    f.fd_ = FileDescriptor(::open(f.path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!f.fd_.valid()) return Status::from_errno(errno, "checkpoint: open " + f.path_);
    f.state_ = new_hash_state();
    return f;
}

Status CheckpointWriter::end_file(CheckpointFile& file) {
    ZINF_ASSERT(file.fd_.valid());
    if (::fsync(file.fd_.get()) != 0) {
        return Status::from_errno(errno, "checkpoint: fsync " + file.path_);
    }
    files_.push_back("file " + file.name_ + " " + std::to_string(file.bytes_) + " " +
                     hex(XXH3_64bits_digest(static_cast<XXH3_state_t*>(file.state_.get()))));
    file.fd_ = FileDescriptor();
    return Status::ok();
}

Status CheckpointWriter::commit() {
    ZINF_ASSERT(!committed_);
    std::string manifest = "zinfinity-checkpoint 1\n";
    for (const auto& [k, v] : values_) manifest += k + " " + v + "\n";
    for (const auto& f : files_) manifest += f + "\n";
    ZINF_TRY(write_all(temp_path_ + "/manifest.txt",
                       std::as_bytes(std::span<const char>(manifest.data(), manifest.size()))));
    ZINF_TRY(fsync_directory(temp_path_));
    const std::string final_path = dir_ + "/" + tag_;
    const std::string old_path = dir_ + "/." + tag_ + ".old." + std::to_string(::getpid());
    std::error_code ec;
    const bool replacing = fs::exists(final_path, ec);
    if (replacing && ::rename(final_path.c_str(), old_path.c_str()) != 0) {
        return Status::from_errno(errno, "checkpoint: rename " + final_path);
    }
    if (::rename(temp_path_.c_str(), final_path.c_str()) != 0) {
        const int e = errno;
        if (replacing) (void)::rename(old_path.c_str(), final_path.c_str());
        return Status::from_errno(e, "checkpoint: rename " + temp_path_ + " to " + final_path);
    }
    committed_ = true;
    if (replacing) fs::remove_all(old_path, ec);
    // <dir>/latest names the newest tag, as DeepSpeed's does; replaced atomically too.
    const std::string latest_tmp = dir_ + "/.latest.tmp." + std::to_string(::getpid());
    fs::remove(latest_tmp, ec);
    ZINF_TRY(write_all(latest_tmp, std::as_bytes(std::span<const char>(tag_.data(), tag_.size()))));
    if (::rename(latest_tmp.c_str(), (dir_ + "/latest").c_str()) != 0) {
        return Status::from_errno(errno, "checkpoint: rename " + latest_tmp);
    }
    return fsync_directory(dir_);
}

Result<CheckpointReader> CheckpointReader::open(const std::string& dir, const std::string& tag) {
    CheckpointReader r;
    r.path_ = dir + "/" + tag;
    std::ifstream in(r.path_ + "/manifest.txt");
    if (!in) return Status::not_found("checkpoint: no manifest at " + r.path_ + "/manifest.txt");
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
    auto it = files_.find(name);
    if (it == files_.end()) {
        return Status::corruption("checkpoint " + path_ + ": manifest lists no file '" + name +
                                  "'");
    }
    if (it->second.size_bytes != out.size()) {
        return Status::corruption("checkpoint " + path_ + "/" + name + ": " +
                                  std::to_string(it->second.size_bytes) + " bytes, expected " +
                                  std::to_string(out.size()));
    }
    const std::string path = path_ + "/" + name;
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return Status::from_errno(errno, "checkpoint: open " + path);
    std::size_t done = 0;
    while (done < out.size()) {
        const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return Status::from_errno(errno, "checkpoint: read " + path);
        }
        if (n == 0)
            return Status::corruption("checkpoint: " + path + " is shorter than its manifest says");
        done += static_cast<std::size_t>(n);
    }
    if (checksum(out) != it->second.checksum) {
        return Status::corruption("checkpoint: " + path + ": checksum mismatch");
    }
    return Status::ok();
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
    f.name_ = name;
    f.path_ = path_ + "/" + name;
    f.fd_ = FileDescriptor(::open(f.path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (!f.fd_.valid()) return Status::from_errno(errno, "checkpoint: open " + f.path_);
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
