"""zinfinity for PyTorch: a torch model trained by the engine with DeepSpeed's calls, and the
engine's CPU optimizers, asynchronous I/O and NVMe-offloaded optimizer for any torch model.

- ``zinfinity.initialize(args, model, config=...)``: DeepSpeed's ``initialize``; the engine's
  ZeRO stages 0-3 and placements on CPU and NVMe (``import zinfinity as deepspeed``).
- ``zinfinity.zero.Init`` / ``GatheredParameters``; ``zinfinity.checkpoint.consolidate``.

- ``zinfinity.optim.CPUAdam`` (and ``CPUAdagrad``, ``CPULion``): ``torch.optim.Optimizer`` s over
  CPU tensors that run zinfinity's SIMD kernel; a drop-in for DeepSpeed's ``DeepSpeedCPUAdam``.
- ``zinfinity.io.AsyncIOHandle``: DeepSpeed's ``aio_handle`` methods (``async_pread``,
  ``async_pwrite``, ``sync_pread``, ``sync_pwrite``, ``wait``, ``new_cpu_locked_tensor``) over the
  engine's io_uring / libaio / posix backends.
- ``zinfinity.offload.NVMeOptimizer``: the fp32 master parameters and the optimizer states in a
  checksummed swap store on NVMe, streamed through pinned buffers at every ``step()``.

Errors raise ``ValueError`` (bad arguments), ``FileNotFoundError``, ``OSError`` (I/O, disk full),
``zinfinity.CorruptionError`` (a swap block whose checksum does not match; a subclass of
``OSError``) with the engine's message, which names the path, offset or partition.
"""

from . import _C
from ._C import CorruptionError

__version__ = "0.1.0"


def set_num_threads(threads: int) -> None:
    """Threads of the CPU optimizer kernel (0, the default: every core)."""
    _C.set_num_threads(int(threads))


def kernel_info() -> dict:
    """The SIMD variant (``isa``: avx512, avx2 or scalar) and threads the kernel runs."""
    return _C.kernel_info()


from . import io, offload, optim  # noqa: E402  (after _C, which they use)
from . import zero, checkpoint  # noqa: E402
from .engine import initialize, add_config_arguments, ZinfinityEngine  # noqa: E402

import atexit as _atexit  # noqa: E402

_atexit.register(_C.finalize)  # open engines closed, then MPI finalized (under mpirun)

__all__ = ["CorruptionError", "set_num_threads", "kernel_info", "io", "offload", "optim", "zero",
           "checkpoint", "initialize", "add_config_arguments", "ZinfinityEngine"]
