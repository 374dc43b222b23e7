// The alignment O_DIRECT needs on a file: queried from the kernel, never assumed.
#pragma once

#include <cstddef>
#include <string>

#include "src/base/status.h"

namespace zinf::io {

struct DirectIoAlignment {
    // Alignment, in bytes, of buffer addresses, file offsets and lengths for O_DIRECT on the
    // file: the larger of the memory and offset alignments the kernel reports. A power of two.
    std::size_t alignment_bytes = 4096;
    // False when the kernel says the file cannot do direct I/O at all (statx DIOALIGN of 0).
    bool direct_supported = true;
    // Where the answer came from: "statx", "tmpfs", "sysfs", "probe" or "default".
    const char* source = "default";
};

// Queries the direct-I/O alignment of the open file `fd` (named `path` in messages): statx with
// STATX_DIOALIGN where the kernel has it, else 1 on tmpfs (which needs none), else the
// logical_block_size of the backing block device in /sys/dev/block/MAJ:MIN/queue, else a probe
// with O_DIRECT reads of growing alignment (on a non-empty file), else 4096, which is safe for
// every logical block size up to a page.
// Blocks briefly (a few syscalls); never allocates on success.
Result<DirectIoAlignment> query_direct_io_alignment(int fd, const std::string& path);

}  // namespace zinf::io
