"""Faces of zinfinity that other libraries' users already know.

- ``zinfinity.compat.deepspeed``: DeepSpeed's ``DeepSpeedCPUAdam``, ``DeepSpeedCPUAdagrad``,
  ``DeepSpeedCPULion``, ``aio_handle`` and op builders, with DeepSpeed's signatures, state keys
  and return codes, over the same kernel and I/O engine as ``zinfinity.optim`` and
  ``zinfinity.io``; ``install()`` maps ``deepspeed.ops`` onto them.
"""

__all__ = ["deepspeed"]
