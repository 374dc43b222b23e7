"""Asynchronous file I/O on CPU tensors: DeepSpeed's ``aio_handle`` over zinfinity's engine.

The method names and arguments are those of ``deepspeed.ops.op_builder.AsyncIOBuilder().load()
.aio_handle``, so code written for it ports by changing the import::

    from zinfinity.io import AsyncIOHandle
    h = AsyncIOHandle(block_size=1 << 20, queue_depth=8, single_submit=False,
                      overlap_events=True, intra_op_parallelism=1)
    buf = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.float32))
    h.async_pwrite(buf, "/mnt/nvme/x.bin")
    h.wait()          # 1: the number of operations completed

(``zinfinity.compat.deepspeed.aio_handle`` has DeepSpeed's defaults and return codes too.)

Files are opened with O_DIRECT where the file system accepts it (``use_direct``), at the
alignment the kernel reports for the file (none on tmpfs). Every CPU tensor is accepted: one
whose address misses that alignment, or that is not contiguous, is copied through an aligned
locked buffer (a *bounce*), counted by ``bounce_stats()`` so that the copy is never hidden.
Sizes and offsets need no alignment: an odd tail goes through the page cache. A write creates
the file if needed and never truncates it. A file may be named by path or by an open
descriptor (``fd=``). Errors raise ValueError (bad tensor, a read past the end of the file),
FileNotFoundError or OSError naming the path, offset and cause.
"""

import fcntl
import os
import stat
import threading
import time

import torch

from . import _C
from ._tensors import check_cpu

__all__ = ["AsyncIOHandle", "aio_handle", "is_locked", "locked_region_count"]

# The memory of new_cpu_locked_tensor, for the whole process (as DeepSpeed's pin manager, so
# that one handle frees or recognises another's): base address -> (LockedBuffer, bytes).
_LOCKED = {}
_LOCKED_MUTEX = threading.Lock()

# Bounce buffers kept for reuse by each handle, at most this many bytes.
BOUNCE_CACHE_BYTES_MAX = 64 << 20


def is_locked(tensor):
    """True when ``tensor``'s bytes lie inside one allocation of ``new_cpu_locked_tensor`` (of
    any handle) that has not been freed."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return False
    begin = tensor.data_ptr()
    end = begin + tensor.numel() * tensor.element_size()
    with _LOCKED_MUTEX:
        return any(base <= begin and end <= base + size for base, (_, size) in _LOCKED.items())


def locked_region_count():
    """How many allocations of ``new_cpu_locked_tensor`` are registered (not yet freed)."""
    with _LOCKED_MUTEX:
        return len(_LOCKED)


def _new_locked(nbytes):
    """A LockedBuffer of ``nbytes`` (page-aligned, mlock'ed) and a uint8 tensor over it."""
    buf = _C.LockedBuffer(nbytes)
    return buf, torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)


def _aligned_bytes(nbytes, alignment):
    """Memory for a bounce: locked where mlock allows (as DeepSpeed's), else plain memory cut at
    ``alignment``. Returns (owner, uint8 tensor of nbytes, locked)."""
    if alignment <= 4096:
        try:
            buf, view = _new_locked(nbytes)
            return buf, view, True
        except (OSError, RuntimeError, MemoryError):
            pass  # RLIMIT_MEMLOCK reached: aligned unlocked memory serves O_DIRECT as well
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % alignment
    return raw, raw[skip:skip + nbytes], False


def fd_path(fd, write, what):
    """The path of the regular file open as ``fd``, checked to be the same file (device and
    inode) and open for the direction asked. ValueError otherwise (a deleted or unnamed file,
    not a regular file, a read-only descriptor for a write)."""
    try:
        link = os.readlink(f"/proc/self/fd/{int(fd)}")
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as e:
        raise ValueError(f"{what}: fd {fd} is not an open file descriptor ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what}: fd {fd} ({link}) is not a regular file")
    mode = flags & os.O_ACCMODE
    if (write and mode == os.O_RDONLY) or (not write and mode == os.O_WRONLY):
        raise ValueError(f"{what}: fd {fd} ({link}) is open {'read' if write else 'write'}-only")
    try:
        named = os.stat(link, follow_symlinks=False)
    except OSError:
        named = None
    if named is None or (named.st_dev, named.st_ino) != (st.st_dev, st.st_ino):
        raise ValueError(f"{what}: fd {fd}'s file is no longer at {link} (deleted or renamed)")
    return link


class _Bounce:
    """One operation's aligned copy of a tensor the file's alignment (or its layout) refuses."""

    def __init__(self, user, owner, view, locked):
        self.user = user
        self.owner = owner
        self.view = view
        self.locked = locked

    def typed(self):
        return self.view.view(self.user.dtype).view(self.user.shape)


class AsyncIOHandle:
    """DeepSpeed's aio_handle. ``backend``: auto (io_uring, else libaio, else posix), io_uring,
    libaio or posix; ``use_direct``: O_DIRECT where accepted (True) or the page cache (False)."""

    def __init__(self, block_size=1048576, queue_depth=128, single_submit=False,
                 overlap_events=True, intra_op_parallelism=1, backend="auto", use_direct=True):
        self._h = _C.AioHandle(int(block_size), int(queue_depth), bool(single_submit),
                               bool(overlap_events), int(intra_op_parallelism), str(backend),
                               bool(use_direct))
        self._inflight = []  # the tensors of operations not yet waited for
        self._bounces = []   # (_Bounce, is_read) of operations not yet waited for
        self._bounce_cache = []  # (owner, view, locked) kept for reuse
        self._bounce_count = 0
        self._bounce_bytes = 0
        self._bounce_seconds = 0.0

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

    def bounce_stats(self):
        """The copies through aligned memory since the handle was made: ``bounces`` (tensors
        copied), ``bytes`` (their size), ``seconds`` (time spent copying), ``cached_bytes``
        (bounce memory kept for reuse)."""
        return {"bounces": self._bounce_count, "bytes": self._bounce_bytes,
                "seconds": self._bounce_seconds,
                "cached_bytes": sum(v.numel() for _, v, _ in self._bounce_cache)}

    def is_pinned(self, tensor):
        """True for a tensor torch pinned or one inside ``new_cpu_locked_tensor`` memory."""
        return bool(tensor.is_pinned()) or is_locked(tensor)

    # --- transfers ------------------------------------------------------------------------------
    def _target(self, filename, fd, write, what):
        """The path to open: ``filename``, or the file of descriptor ``fd`` (also when an int
        comes where the file name goes, as DeepSpeed's overload)."""
        if fd is None and isinstance(filename, int) and not isinstance(filename, bool):
            filename, fd = None, filename
        if (filename is None) == (fd is None):
            raise ValueError(f"{what}: give the file as filename or as fd, exactly one")
        if fd is not None:
            return fd_path(fd, write, what)
        return os.fspath(filename) if not isinstance(filename, str) else filename

    def _args(self, buffer, path, file_offset, what):
        check_cpu(buffer, what, contiguous=False)
        if buffer.numel() == 0:
            raise ValueError(f"{what}: an empty tensor ({path})")
        offset = int(file_offset)
        if offset < 0:
            raise ValueError(f"{what}: negative file offset {offset} ({path})")
        return buffer.numel() * buffer.element_size(), offset

    def _start(self, write, buffer, path, file_offset, what):
        """Starts one transfer, through a bounce when the tensor is not contiguous or its
        address misses the file's O_DIRECT alignment."""
        nbytes, offset = self._args(buffer, path, file_offset, what)
        if buffer.is_contiguous():
            alignment = self._h.submit(write, buffer.data_ptr(), nbytes, path, offset)
            if alignment == 0:
                self._inflight.append(buffer)
                return
        else:
            alignment = 4096
        bounce = self._take_bounce(buffer, nbytes, alignment)
        if write:
            began = time.perf_counter()
            bounce.typed().copy_(buffer)
            self._count_bounce(nbytes, time.perf_counter() - began)
        try:
            missed = self._h.submit(write, bounce.view.data_ptr(), nbytes, path, offset)
        except BaseException:
            self._give_back(bounce)
            raise
        if missed != 0:  # cannot happen: the bounce is aligned to what the file asked
            self._give_back(bounce)
            raise ValueError(f"{what}: {path} asks {missed}-byte alignment; the bounce buffer "
                             f"at 0x{bounce.view.data_ptr():x} misses it")
        self._bounces.append((bounce, not write))

    def _take_bounce(self, user, nbytes, alignment):
        for i, (owner, view, locked) in enumerate(self._bounce_cache):
            if view.numel() >= nbytes and view.data_ptr() % alignment == 0:
                del self._bounce_cache[i]
                return _Bounce(user, owner, view[:nbytes], locked)
        owner, view, locked = _aligned_bytes(nbytes, alignment)
        return _Bounce(user, owner, view, locked)

    def _give_back(self, bounce):
        if isinstance(bounce.owner, torch.Tensor):
            return  # plain memory: let it go
        whole = torch.frombuffer(bounce.owner, dtype=torch.uint8, count=bounce.owner.size)
        cached = sum(v.numel() for _, v, _ in self._bounce_cache)
        if cached + whole.numel() <= BOUNCE_CACHE_BYTES_MAX:
            self._bounce_cache.append((bounce.owner, whole, bounce.locked))

    def _count_bounce(self, nbytes, seconds):
        self._bounce_count += 1
        self._bounce_bytes += nbytes
        self._bounce_seconds += seconds

    def async_pread(self, buffer, filename=None, file_offset=0, fd=None):
        """Starts reading ``buffer.nbytes`` bytes of the file (``filename`` or ``fd``) at
        ``file_offset`` into ``buffer``; returns 0. ``wait()`` completes it."""
        path = self._target(filename, fd, False, "async_pread")
        self._start(False, buffer, path, file_offset, "async_pread")
        return 0

    def async_pwrite(self, buffer, filename=None, file_offset=0, fd=None):
        """Starts writing ``buffer`` to the file (``filename`` or ``fd``) at ``file_offset``;
        returns 0."""
        path = self._target(filename, fd, True, "async_pwrite")
        self._start(True, buffer, path, file_offset, "async_pwrite")
        return 0

    def sync_pread(self, buffer, filename=None, file_offset=0, fd=None):
        """Reads and waits; returns the number of operations completed (with any started
        asynchronously before)."""
        self.async_pread(buffer, filename, file_offset, fd)
        return self.wait()

    def sync_pwrite(self, buffer, filename=None, file_offset=0, fd=None):
        """Writes and waits; returns the number of operations completed."""
        self.async_pwrite(buffer, filename, file_offset, fd)
        return self.wait()

    def wait(self):
        """Waits for every operation started; returns how many completed. Reads that went
        through a bounce are copied into their tensors here. If one operation failed, all are
        still waited for, then its error is raised (and no bounced read is copied)."""
        # The tensors of the operations this wait completes; one started meanwhile by another
        # thread belongs to the next wait and stays referenced.
        pending, self._inflight = self._inflight, []
        bounces, self._bounces = self._bounces, []
        try:
            done = self._h.wait()
            for bounce, is_read in bounces:
                if is_read:
                    began = time.perf_counter()
                    bounce.user.copy_(bounce.typed())
                    self._count_bounce(bounce.view.numel(), time.perf_counter() - began)
            return done
        finally:
            for bounce, _ in bounces:
                self._give_back(bounce)
            del pending

    # --- page-aligned locked memory ------------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        """A 1-D tensor of ``num_elem`` elements of ``example_tensor``'s dtype in page-aligned,
        mlock'ed memory (O_DIRECT-ready), zero-filled."""
        n = int(num_elem)
        if n <= 0:
            raise ValueError(f"new_cpu_locked_tensor: num_elem {num_elem} must be positive")
        dtype = example_tensor.dtype
        nbytes = n * torch.empty(0, dtype=dtype).element_size()
        buf = _C.LockedBuffer(nbytes)
        t = torch.frombuffer(buf, dtype=dtype, count=n)
        with _LOCKED_MUTEX:
            _LOCKED[t.data_ptr()] = (buf, nbytes)
        return t

    def free_cpu_locked_tensor(self, tensor):
        """Lets the locked memory of ``tensor`` (made by ``new_cpu_locked_tensor`` of any
        handle) go; it is unlocked and freed once no tensor refers to it (never under a live
        tensor). Returns True, or False when ``tensor`` does not start such memory."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return False
        with _LOCKED_MUTEX:
            return _LOCKED.pop(tensor.data_ptr(), None) is not None

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is not None and h.pending():
            try:
                h.wait()
            except Exception:  # noqa: BLE001 (nothing to report to at teardown)
                pass


aio_handle = AsyncIOHandle  # DeepSpeed's name
