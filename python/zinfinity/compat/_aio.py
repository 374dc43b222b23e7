"""DeepSpeed's async I/O op (what ``AsyncIOBuilder().load()`` returns) over zinfinity's engine:
``aio_handle`` with DeepSpeed's defaults, methods and return codes, and the module functions
``aio_read``, ``aio_write`` and ``deepspeed_memcpy``.

Return codes as DeepSpeed's: ``sync_*`` give the number of operations completed (with any
started asynchronously before), ``async_*`` give 0, and -1 (with a message on stdout) where
DeepSpeed refuses: a file to read that does not exist or cannot be opened, a directory to write
in that does not exist; and, where DeepSpeed's release build reads garbage, a read past the end
of the file. Errors that DeepSpeed leaves unchecked (a failed or short transfer) raise OSError.
"""

import os

import torch

from .. import CorruptionError
from ..io import AsyncIOHandle

__all__ = ["aio_handle", "aio_read", "aio_write", "deepspeed_memcpy"]


def _file_bytes(path, offset, count):
    """``count`` bytes of ``path`` at ``offset`` through the page cache."""
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), count, offset)


def _tensor_bytes(tensor):
    return tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


class aio_handle(AsyncIOHandle):  # noqa: N801 (DeepSpeed's name)
    """DeepSpeed's ``aio_handle(block_size, queue_depth, single_submit, overlap_events,
    intra_op_parallelism)`` with its defaults (``overlap_events=False``). ``num_threads`` is
    DeepSpeed's older name of ``intra_op_parallelism``; ``backend`` and ``use_direct`` are
    zinfinity's (``zinfinity.io.AsyncIOHandle``)."""

    def __init__(self, block_size=1048576, queue_depth=128, single_submit=False,
                 overlap_events=False, intra_op_parallelism=1, *, num_threads=None,
                 backend="auto", use_direct=True):
        if num_threads is not None:
            intra_op_parallelism = num_threads
        super().__init__(block_size, queue_depth, single_submit, overlap_events,
                         intra_op_parallelism, backend, use_direct)
        self._to_validate = []  # (tensor, path, offset, write) checked at the next wait()

    def get_alignment(self):
        """DeepSpeed's value, ``intra_op_parallelism * 512`` (the granularity it splits an
        operation by). zinfinity splits at any byte and needs no size alignment."""
        return self.get_intra_op_parallelism() * 512

    # --- DeepSpeed's refusals as -1 -------------------------------------------------------------
    def _refused(self, write, buffer, filename, fd, file_offset, what):
        """The path to use, or None after printing why DeepSpeed would return -1."""
        path = self._target(filename, fd, write, what)
        if write:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                print(f"deepspeed_aio:   open for write failed on {path} error = 2")
                return None
            return path
        try:
            size = os.stat(path).st_size
        except OSError as e:
            print(f"deepspeed_aio:   fstat for read failed on {path} error = {e.errno}")
            return None
        nbytes, offset = self._args(buffer, path, file_offset, what)
        if offset + nbytes > size:
            print(f"{path}: file_offset + buffer nbytes > file bytes {offset + nbytes} > {size}")
            return None
        return path

    def _submit(self, write, buffer, filename, fd, file_offset, what):
        path = self._refused(write, buffer, filename, fd, file_offset, what)
        if path is None:
            return None
        try:
            self._start(write, buffer, path, file_offset, what)
        except (FileNotFoundError, PermissionError) as e:
            print(f"deepspeed_aio:   open for {'write' if write else 'read'} failed on {path} "
                  f"error = {e.errno}")
            return None
        return path

    def async_pread(self, buffer, filename=None, file_offset=0, fd=None):
        """0 when started, -1 when refused."""
        return -1 if self._submit(False, buffer, filename, fd, file_offset,
                                  "async_pread") is None else 0

    def async_pwrite(self, buffer, filename=None, file_offset=0, fd=None):
        """0 when started, -1 when refused."""
        return -1 if self._submit(True, buffer, filename, fd, file_offset,
                                  "async_pwrite") is None else 0

    def sync_pread(self, buffer, filename=None, file_offset=0, fd=None):
        """The number of operations completed, -1 when refused."""
        return self.pread(buffer, filename, False, False, file_offset, fd=fd)

    def sync_pwrite(self, buffer, filename=None, file_offset=0, fd=None):
        """The number of operations completed, -1 when refused."""
        return self.pwrite(buffer, filename, False, False, file_offset, fd=fd)

    def _transfer(self, write, buffer, filename, validate, async_op, file_offset, fd, extra):
        if extra:
            async_op = bool(extra.pop("async", async_op))
            if extra:
                raise TypeError(f"unexpected arguments {sorted(extra)}")
        what = "pwrite" if write else "pread"
        path = self._submit(write, buffer, filename, fd, file_offset, what)
        if path is None:
            return -1
        if validate:
            self._to_validate.append((buffer, path, int(file_offset), write))
        if async_op:
            return 0
        try:
            return self.wait()
        except CorruptionError as e:
            print(e)
            return -1

    def pread(self, buffer, filename=None, validate=False, async_op=False, file_offset=0,
              fd=None, **extra):
        """DeepSpeed's ``pread(buffer, filename, validate, async, file_offset)`` (``async`` is
        taken positionally or as ``**{"async": ...}``): 0 when started asynchronously, the
        number completed when synchronous, -1 when refused or (synchronous) when ``validate``
        finds the bytes differ from a buffered read of the file."""
        return self._transfer(False, buffer, filename, validate, async_op, file_offset, fd, extra)

    def pwrite(self, buffer, filename=None, validate=False, async_op=False, file_offset=0,
               fd=None, **extra):
        """DeepSpeed's ``pwrite``: as ``pread``, writing."""
        return self._transfer(True, buffer, filename, validate, async_op, file_offset, fd, extra)

    def read(self, buffer, filename, validate=False, file_offset=0):
        """Reads ``buffer.nbytes`` at ``file_offset`` and waits: 0, or -1 when refused or not
        validated."""
        done = self.pread(buffer, filename, validate, False, file_offset)
        return -1 if done < 0 else 0

    def write(self, buffer, filename, validate=False, file_offset=0):
        """Writes ``buffer`` at ``file_offset`` and waits: 0, or -1 when refused or not
        validated."""
        done = self.pwrite(buffer, filename, validate, False, file_offset)
        return -1 if done < 0 else 0

    def wait(self):
        """The number of operations completed. Operations started with ``validate`` are then
        compared with a buffered read of their file; a difference raises
        zinfinity.CorruptionError naming the file and offset (DeepSpeed prints "Fail")."""
        checks, self._to_validate = self._to_validate, []
        done = super().wait()
        for tensor, path, offset, write in checks:
            expected = _tensor_bytes(tensor)
            if _file_bytes(path, offset, len(expected)) != expected:
                raise CorruptionError(f"validate: the {'write' if write else 'read'} of "
                                      f"{len(expected)} bytes at offset {offset} of {path} "
                                      f"differs from a buffered read of the file")
        return done

    def new_cpu_locked_tensor(self, num_elem, example_tenosr=None, example_tensor=None):
        """DeepSpeed's spelling of the example's keyword (``example_tenosr``) or the right
        one."""
        example = example_tenosr if example_tenosr is not None else example_tensor
        if example is None:
            raise TypeError("new_cpu_locked_tensor: give an example tensor (its dtype is used)")
        return super().new_cpu_locked_tensor(num_elem, example)


def _whole_file(handle, buffer, filename, validate, write):
    if write:
        return handle.write(buffer, filename, validate, 0)
    try:
        size = os.stat(filename).st_size
    except OSError as e:
        print(f"deepspeed_aio:   fstat for read failed on {filename} error = {e.errno}")
        return -1
    nbytes = buffer.numel() * buffer.element_size()
    if nbytes != size:
        print(f"{filename}: buffer nbytes {nbytes} != file bytes {size}")
        return -1
    return handle.read(buffer, filename, validate, 0)


def aio_read(buffer, filename, block_size, queue_depth, single_submit, overlap_events,
             validate):
    """Reads the whole of ``filename`` (its size must be ``buffer``'s) into ``buffer``: 0, or
    -1 when the file is missing or of another size."""
    h = aio_handle(block_size, queue_depth, single_submit, overlap_events, 1)
    return _whole_file(h, buffer, filename, validate, False)


def aio_write(buffer, filename, block_size, queue_depth, single_submit, overlap_events,
              validate):
    """Writes ``buffer`` at the start of ``filename`` (created, never truncated): 0 or -1."""
    h = aio_handle(block_size, queue_depth, single_submit, overlap_events, 1)
    return _whole_file(h, buffer, filename, validate, True)


def deepspeed_memcpy(dest, src):
    """Copies ``src`` into ``dest`` (same number of elements); returns 0."""
    if dest.numel() != src.numel():
        raise ValueError(f"deepspeed_memcpy: dest has {dest.numel()} elements, src "
                         f"{src.numel()}")
    with torch.no_grad():
        dest.copy_(src.view(dest.shape) if src.is_contiguous() else src.reshape(dest.shape))
    return 0
