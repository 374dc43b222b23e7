"""Asynchronous file I/O on CPU tensors: DeepSpeed's ``aio_handle`` over zinfinity's engine.

The method names and arguments are those of ``deepspeed.ops.op_builder.AsyncIOBuilder().load()
.aio_handle``, so code written for it ports by changing the import::

    from zinfinity.io import AsyncIOHandle
    h = AsyncIOHandle(block_size=1 << 20, queue_depth=8, single_submit=False,
                      overlap_events=True, intra_op_parallelism=1)
    buf = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.float32))
    h.async_pwrite(buf, "/mnt/nvme/x.bin")
    h.wait()          # 1: the number of operations completed

Files are opened with O_DIRECT where the file system accepts it (``use_direct``); a tensor then
must start on the file's logical block (``new_cpu_locked_tensor`` gives page-aligned memory; a
slice that starts elsewhere is refused with ValueError rather than silently copied). Sizes and
offsets need no alignment: an odd tail goes through the page cache. A write creates the file if
needed and never truncates it. Errors raise ValueError (bad tensor, a read past the end of the
file), FileNotFoundError or OSError naming the path, offset and cause.
"""

import torch

from . import _C
from ._tensors import check_cpu

__all__ = ["AsyncIOHandle", "aio_handle"]


class AsyncIOHandle:
    """DeepSpeed's aio_handle. ``backend``: auto (io_uring, else libaio, else posix), io_uring,
    libaio or posix; ``use_direct``: O_DIRECT where accepted (True) or the page cache (False)."""

    def __init__(self, block_size=1048576, queue_depth=128, single_submit=False,
                 overlap_events=True, intra_op_parallelism=1, backend="auto", use_direct=True):
        self._h = _C.AioHandle(int(block_size), int(queue_depth), bool(single_submit),
                               bool(overlap_events), int(intra_op_parallelism), str(backend),
                               bool(use_direct))
        self._inflight = []  # the tensors of operations not yet waited for
        self._locked = {}    # data_ptr -> LockedBuffer of new_cpu_locked_tensor

    # --- DeepSpeed's getters -------------------------------------------------------------------
    def get_block_size(self):
        return self._h.block_size

    def get_queue_depth(self):
        return self._h.queue_depth

    def get_single_submit(self):
        return self._h.single_submit

    def get_overlap_events(self):
        return self._h.overlap_events

    def get_intra_op_parallelism(self):
        return self._h.intra_op_parallelism

    get_thread_count = get_intra_op_parallelism

    @property
    def backend(self):
        """The engine backend in use: io_uring, libaio or posix."""
        return self._h.backend

    def stats(self):
        """Bytes read and written, operations and pieces completed since the handle was made."""
        return self._h.stats()

    # --- transfers ------------------------------------------------------------------------------
    def _args(self, buffer, filename, file_offset, what):
        check_cpu(buffer, what)
        if buffer.numel() == 0:
            raise ValueError(f"{what}: an empty tensor ({filename})")
        offset = int(file_offset)
        if offset < 0:
            raise ValueError(f"{what}: negative file offset {offset} ({filename})")
        return buffer.data_ptr(), buffer.numel() * buffer.element_size(), str(filename), offset

    def async_pread(self, buffer, filename, file_offset=0):
        """Starts reading ``buffer.nbytes`` bytes of ``filename`` at ``file_offset`` into
        ``buffer``; returns 0. ``wait()`` completes it."""
        ptr, nbytes, path, offset = self._args(buffer, filename, file_offset, "async_pread")
        self._h.submit(False, ptr, nbytes, path, offset)
        self._inflight.append(buffer)
        return 0

    def async_pwrite(self, buffer, filename, file_offset=0):
        """Starts writing ``buffer`` to ``filename`` at ``file_offset``; returns 0."""
        ptr, nbytes, path, offset = self._args(buffer, filename, file_offset, "async_pwrite")
        self._h.submit(True, ptr, nbytes, path, offset)
        self._inflight.append(buffer)
        return 0

    def sync_pread(self, buffer, filename, file_offset=0):
        """Reads and waits; returns the number of operations completed (with any started
        asynchronously before)."""
        self.async_pread(buffer, filename, file_offset)
        return self.wait()

    def sync_pwrite(self, buffer, filename, file_offset=0):
        """Writes and waits; returns the number of operations completed."""
        self.async_pwrite(buffer, filename, file_offset)
        return self.wait()

    def wait(self):
        """Waits for every operation started; returns how many completed. If one failed, all
        are still waited for, then its error is raised."""
        # The tensors of the operations this wait completes; one started meanwhile by another
        # thread belongs to the next wait and stays referenced.
        pending, self._inflight = self._inflight, []
        try:
            return self._h.wait()
        finally:
            del pending

    # --- page-aligned locked memory ------------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        """A 1-D tensor of ``num_elem`` elements of ``example_tensor``'s dtype in page-aligned,
        mlock'ed memory (O_DIRECT-ready), zero-filled."""
        n = int(num_elem)
        if n <= 0:
            raise ValueError(f"new_cpu_locked_tensor: num_elem {num_elem} must be positive")
        dtype = example_tensor.dtype
        buf = _C.LockedBuffer(n * torch.empty(0, dtype=dtype).element_size())
        t = torch.frombuffer(buf, dtype=dtype, count=n)
        self._locked[t.data_ptr()] = buf
        return t

    def free_cpu_locked_tensor(self, tensor):
        """Lets the locked memory of ``tensor`` go; it is unlocked and freed once no tensor
        refers to it (never under a live tensor)."""
        if self._locked.pop(tensor.data_ptr(), None) is None:
            raise ValueError("free_cpu_locked_tensor: not a tensor of new_cpu_locked_tensor")

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is not None and h.pending():
            try:
                h.wait()
            except Exception:  # noqa: BLE001 (nothing to report to at teardown)
                pass


aio_handle = AsyncIOHandle  # DeepSpeed's name
