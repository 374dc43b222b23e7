"""The aio handles on tmpfs (Debian 13's and Fedora's /tmp): O_DIRECT at the alignment the
kernel really requires there (none), so small files, odd addresses and block_size=1024 work
without a bounce. Mounts a 64 MiB tmpfs of its own (needs root; skipped otherwise)."""

import ctypes
import os
import subprocess
import tempfile

import pytest
import torch

from zinfinity.compat import deepspeed as ds
from zinfinity.io import AsyncIOHandle


@pytest.fixture(scope="module")
def tmpfs():
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    base = os.environ.get("ZINF_TEST_TMPDIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix="zinf-tmpfs-", dir=base)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", path],
                          capture_output=True, text=True)
    if done.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"mount -t tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        probe = os.path.join(path, "probe")
        with open(probe, "wb") as f:
            f.write(b"x")
        try:
            os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        except OSError as e:
            pytest.skip(f"this kernel refuses O_DIRECT on tmpfs ({e.strerror}; Linux < 6.6)")
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def test_the_kernel_takes_an_unaligned_direct_read_on_tmpfs(tmpfs):
    """The measurement the handles rely on: a 1000-byte O_DIRECT read at offset 24 into memory
    off every alignment."""
    path = os.path.join(tmpfs, "raw.bin")
    data = os.urandom(5000)
    with open(path, "wb") as f:
        f.write(data)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        memory = bytearray(2000)
        view = memoryview(memory)[3:1003]
        assert os.preadv(fd, [view], 24) == 1000
    finally:
        os.close(fd)
    assert bytes(memory[3:1003]) == data[24:1024]


def test_small_files_odd_addresses_and_1024_byte_blocks(tmpfs):
    h = ds.aio_handle(1024, 2, False, False, 2)  # DeepSpeed's test settings
    path = os.path.join(tmpfs, "small.bin")
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(1))
    assert h.sync_pwrite(data, path) == 1
    assert h._h.is_direct(path)  # O_DIRECT, not a silent fallback to the page cache
    plain = torch.zeros(2000, dtype=torch.uint8)
    view = plain[3:1003]
    assert view.data_ptr() % 512 != 0
    assert h.sync_pread(view, path, 24) == 1
    assert torch.equal(view, data[24:1024])
    assert h.bounce_stats()["bounces"] == 0  # tmpfs asks no alignment: nothing copied
    assert os.path.getsize(path) == 4096


def test_every_address_without_a_bounce_on_tmpfs(tmpfs):
    h = AsyncIOHandle(block_size=1024, queue_depth=4, intra_op_parallelism=2)
    path = os.path.join(tmpfs, "sweep.bin")
    plain = torch.zeros(2048, dtype=torch.uint8)
    for offset in range(0, 512, 7):
        view = plain[offset:offset + 1000]
        view.copy_(torch.full((1000,), offset % 251, dtype=torch.uint8))
        assert h.sync_pwrite(view, path, offset) == 1
        back = torch.zeros(2048, dtype=torch.uint8)[offset + 1:offset + 1001]
        assert h.sync_pread(back, path, offset) == 1
        assert torch.equal(back, view), offset
    assert h.bounce_stats()["bounces"] == 0


def test_the_deepspeed_test_pattern_on_tmpfs(tmpfs):
    """Locked and plain buffers, sync and async, on one handle with DeepSpeed's settings."""
    h = ds.AsyncIOBuilder().load().aio_handle(1024, 2, False, True, 2)
    ref = os.path.join(tmpfs, "ref.bin")
    data = os.urandom(4096)
    with open(ref, "wb") as f:
        f.write(data)
    locked = h.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.uint8))
    plain = torch.empty(4096, dtype=torch.uint8)
    for buffer in (locked, plain):
        assert h.async_pread(buffer, ref) == 0
        assert h.wait() == 1
        assert bytes(buffer.numpy()) == data
        out = os.path.join(tmpfs, f"out-{buffer.data_ptr()}.bin")
        assert h.sync_pwrite(buffer, out) == 1
        with open(out, "rb") as f:
            assert f.read() == data
    assert h.free_cpu_locked_tensor(locked) is True
    # ctypes: the buffers really live where torch says (the engine wrote through the address).
    assert ctypes.string_at(plain.data_ptr(), 4) == data[:4]
