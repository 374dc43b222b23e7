// The on-disk form of a checkpoint: a directory `<dir>/<tag>` of binary files and a text
// manifest (`manifest.txt`: one "key value" per line, and one "file <name> <bytes> <xxh3>" per
// file). The directory is written under a temporary name and renamed into place, so a crash
// leaves either the previous checkpoint of that tag or the new one, never half of one. Every
// file and directory inside is opened relative to an open directory and never through a
// symbolic link; the directory written to must be trusted (io::check_trusted_directory), and
// every call goes through an io::FileSystem, so that faults can be injected into each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "src/base/file.h"
#include "src/base/status.h"

namespace zinf::engine {

// One checkpoint file written or read piece by piece, for states too large to hold in memory at
// once (optimizer states on NVMe). Move-only; the checksum runs over the pieces in order.
class CheckpointFile {
public:
    CheckpointFile() = default;
    CheckpointFile(CheckpointFile&&) noexcept = default;
    CheckpointFile& operator=(CheckpointFile&&) noexcept = default;
    // Appends (writer) or reads the next bytes (reader). Errors: kIo, kNoSpace; reading past
    // the end the manifest states is kCorruption.
    Status append(std::span<const std::byte> bytes);
    Status read(std::span<std::byte> bytes);

private:
    friend class CheckpointWriter;
    friend class CheckpointReader;
    io::FileSystem* fs_ = nullptr;
    FileDescriptor fd_;
    std::string name_;
    std::string path_;
    std::uint64_t bytes_ = 0;           // appended or read so far
    std::uint64_t expected_bytes_ = 0;  // reader: the manifest's size
    std::uint64_t expected_sum_ = 0;    // reader: the manifest's checksum
    std::shared_ptr<void> state_;       // XXH3 streaming state
};

// XXH3-64 of `bytes`.
std::uint64_t checksum(std::span<const std::byte> bytes) noexcept;

// Checks a checkpoint tag: non-empty, at most 255 bytes, no '/', no leading '.', no control
// characters (a tag names a directory inside the checkpoint directory and nothing else).
// kInvalidArgument naming the tag and `source`.
Status check_tag(const std::string& tag, std::string_view source);

// The tag <dir>/latest names, checked with check_tag. kNotFound when there is no such file;
// a symbolic link there is refused (kInvalidArgument).
Result<std::string> read_latest_tag(io::FileSystem& fs, const std::string& dir);

class CheckpointWriter {
public:
    // Creates `dir` if needed, checks that it is trusted (owned by this user or root and not
    // writable by others without the sticky bit, nor any directory above it) and makes a fresh
    // temporary directory (0700) inside it. `fs` is borrowed for the writer's life. Errors: kIo
    // naming the path (unwritable, missing parent), kInvalidArgument for a bad tag (check_tag)
    // or an untrusted directory (naming it, its owner and mode).
    static Result<CheckpointWriter> create(io::FileSystem& fs, const std::string& dir,
                                           const std::string& tag);
    CheckpointWriter(CheckpointWriter&&) noexcept = default;
    CheckpointWriter& operator=(CheckpointWriter&&) noexcept = default;
    // Removes the temporary directory unless commit() succeeded.
    ~CheckpointWriter();

    // Writes one file (fsynced) and records its size and checksum. Errors: kIo, kNoSpace.
    Status write_file(const std::string& name, std::span<const std::byte> bytes);
    // The streaming form: begin, append the bytes in order, end (fsync; recorded in the manifest).
    Result<CheckpointFile> begin_file(const std::string& name);
    Status end_file(CheckpointFile& file);
    void set(const std::string& key, const std::string& value) { values_[key] = value; }
    // Writes the manifest, fsyncs, renames the directory to <dir>/<tag> (replacing an older one
    // of that tag) and points <dir>/latest at the tag (unless set_update_latest(false): a rank's
    // shard inside a checkpoint being written). Errors: kIo.
    Status commit();
    void set_update_latest(bool update) noexcept { update_latest_ = update; }
    // The temporary directory's name inside <dir> (where the other ranks put their shards).
    const std::string& temp_name() const noexcept { return temp_name_; }

private:
    CheckpointWriter() = default;
    io::FileSystem* fs_ = nullptr;
    io::Directory dir_;   // the checkpoint directory
    io::Directory temp_;  // <dir>/.<tag>.tmp.<pid>, renamed to <dir>/<tag> by commit()
    std::string tag_;
    std::string temp_name_;
    std::map<std::string, std::string> values_;
    std::vector<std::string> files_;  // "file <name> <bytes> <checksum>" lines
    bool committed_ = true;           // nothing to clean up until create() succeeds
    bool update_latest_ = true;
};

class CheckpointReader {
public:
    // Reads <dir>/<tag>/manifest.txt (`fs` borrowed for the reader's life). Errors: kNotFound
    // (no such checkpoint), kCorruption (bad manifest), kInvalidArgument (a bad tag, or a
    // symbolic link where the tag's directory or one of its files should be).
    static Result<CheckpointReader> open(io::FileSystem& fs, const std::string& dir,
                                         const std::string& tag);
    const std::string& path() const noexcept { return path_; }
    // The value of `key`; kCorruption naming the key when absent.
    Result<std::string> get(const std::string& key) const;
    Result<std::uint64_t> get_u64(const std::string& key) const;
    Result<double> get_double(const std::string& key) const;
    // Reads file `name` into `out`, which must be exactly its size; verifies the checksum.
    // Errors: kCorruption (size or checksum mismatch, unknown file), kIo.
    Status read_file(const std::string& name, std::span<std::byte> out) const;
    // The streaming form: open (kCorruption unless the manifest lists `name` with exactly
    // `size_bytes`), read the bytes in order, end (kCorruption unless all were read and the
    // checksum matches). Bytes read before end() are unverified: after an error the caller
    // must discard what it restored.
    Result<CheckpointFile> open_file(const std::string& name, std::uint64_t size_bytes) const;
    Status end_file(CheckpointFile& file) const;
    // The size the manifest gives file `name`; kCorruption when it lists no such file.
    Result<std::uint64_t> file_size(const std::string& name) const;

private:
    struct FileEntry {
        std::uint64_t size_bytes = 0;
        std::uint64_t checksum = 0;
    };
    io::FileSystem* fs_ = nullptr;
    io::Directory tag_dir_;
    std::string path_;
    std::map<std::string, std::string> values_;
    std::map<std::string, FileEntry> files_;
};

}  // namespace zinf::engine
