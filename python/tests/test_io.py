"""zinfinity.io.AsyncIOHandle: DeepSpeed's aio_handle over the engine."""

import os

import pytest
import torch

from zinfinity.io import AsyncIOHandle, aio_handle


@pytest.fixture(params=["auto", "libaio", "posix"])
def handle(request):
    return AsyncIOHandle(block_size=1 << 16, queue_depth=8, single_submit=False,
                         overlap_events=True, intra_op_parallelism=2, backend=request.param)


def random_tensor(h, numel, dtype, seed):
    t = h.new_cpu_locked_tensor(numel, torch.empty(0, dtype=dtype))
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        t.copy_(torch.randint(0, 256, (numel,), generator=g, dtype=torch.uint8))
    else:
        t.copy_(torch.randn(numel, generator=g).to(dtype))
    return t


SIZES = [(1, torch.float32), (3, torch.bfloat16), (4097, torch.float32),
         ((1 << 18) + 5, torch.float16), (1_000_003, torch.uint8)]


def test_round_trip_of_odd_sizes_and_offsets(handle, workdir):
    path = os.path.join(workdir, "data.bin")
    tensors, offset, placed = [], 0, []
    for i, (numel, dtype) in enumerate(SIZES):
        t = random_tensor(handle, numel, dtype, i)
        assert t.data_ptr() % 4096 == 0
        assert handle.async_pwrite(t, path, offset) == 0
        tensors.append(t)
        placed.append(offset)
        offset += t.numel() * t.element_size() + 7  # odd offsets too
    assert handle.wait() == len(SIZES)
    assert os.path.getsize(path) == offset - 7
    back = [handle.new_cpu_locked_tensor(t.numel(), t) for t in tensors]
    for t, at in zip(back, placed):
        handle.async_pread(t, path, at)
    assert handle.wait() == len(SIZES)
    for t, u in zip(tensors, back):
        assert torch.equal(t, u)
    stats = handle.stats()
    assert stats["bytes_written"] == stats["bytes_read"] == sum(
        t.numel() * t.element_size() for t in tensors)
    if handle.get_queue_depth() == 8 and os.environ.get("ZINF_TEST_NO_DIRECT") is None:
        # The data went through the engine's O_DIRECT path where the disk takes it.
        assert handle._h.is_direct(path)


def test_backend_and_getters():
    h = aio_handle(block_size=1 << 20, queue_depth=8, single_submit=True, overlap_events=False,
                   intra_op_parallelism=3, backend="posix")
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism()) == (1 << 20, 8, True, False, 3)
    assert h.get_thread_count() == 3
    assert h.backend == "posix"
    assert AsyncIOHandle().backend in ("io_uring", "libaio", "posix")


def test_sync_calls_return_completed_count(workdir):
    h = AsyncIOHandle(block_size=1 << 20, queue_depth=8)
    path = os.path.join(workdir, "sync.bin")
    t = random_tensor(h, 12345, torch.float32, 3)
    assert h.sync_pwrite(t, path) == 1
    u = h.new_cpu_locked_tensor(12345, t)
    assert h.sync_pread(u, path) == 1
    assert torch.equal(t, u)
    assert h.wait() == 0  # nothing left in flight


def test_a_missing_file_is_named(workdir):
    h = AsyncIOHandle()
    t = h.new_cpu_locked_tensor(1024, torch.empty(0))
    missing = os.path.join(workdir, "no-such-file.bin")
    with pytest.raises(FileNotFoundError, match="no-such-file.bin"):
        h.async_pread(t, missing)
    with pytest.raises(OSError, match="no-such-dir"):
        h.async_pwrite(t, os.path.join(workdir, "no-such-dir", "x.bin"))
    assert h.wait() == 0


def test_a_short_file_is_refused_before_reading(workdir):
    h = AsyncIOHandle()
    path = os.path.join(workdir, "short.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * 1000)
    t = h.new_cpu_locked_tensor(1024, torch.empty(0))  # 4096 bytes
    with pytest.raises(ValueError, match=r"short.bin.*4096 bytes at offset 0.*has 1000"):
        h.async_pread(t, path)
    with pytest.raises(ValueError, match="offset 512"):
        h.sync_pread(h.new_cpu_locked_tensor(200, torch.empty(0)), path, 512)


def test_an_unaligned_tensor_goes_through_a_counted_bounce(workdir):
    h = AsyncIOHandle()
    path = os.path.join(workdir, "aligned.bin")
    t = random_tensor(h, 4096, torch.float32, 5)
    assert h.sync_pwrite(t, path) == 1
    if not h._h.is_direct(path):
        pytest.skip(f"{workdir}: the file system refuses O_DIRECT, so no alignment applies")
    assert h.bounce_stats()["bounces"] == 0  # locked, aligned: no copy
    assert h.sync_pwrite(t[1:], path, 4) == 1  # 4 bytes off every O_DIRECT alignment
    back = h.new_cpu_locked_tensor(4096, t)
    assert h.sync_pread(back[3:], path, 12) == 1
    assert torch.equal(back[3:], t[3:])
    stats = h.bounce_stats()
    # A write copies in, a read copies out: each counted once with its size.
    assert stats["bounces"] == 2 and stats["bytes"] == 4095 * 4 + 4093 * 4
    assert h.wait() == 0


def test_bad_tensors_and_arguments():
    h = AsyncIOHandle()
    with pytest.raises(ValueError, match="on meta"):
        h.async_pwrite(torch.zeros(8, device="meta"), "/tmp/x")
    with pytest.raises(ValueError, match="empty tensor"):
        h.async_pwrite(torch.zeros(0), "/tmp/x")
    with pytest.raises(ValueError, match="negative file offset"):
        h.async_pwrite(torch.zeros(8), "/tmp/x", -1)
    with pytest.raises(ValueError, match="each must be positive"):
        AsyncIOHandle(queue_depth=0)
    with pytest.raises(ValueError, match="num_elem"):
        h.new_cpu_locked_tensor(0, torch.empty(0))
    t = h.new_cpu_locked_tensor(16, torch.empty(0, dtype=torch.bfloat16))
    assert t.dtype == torch.bfloat16 and t.numel() == 16 and bool((t == 0).all())
    assert h.free_cpu_locked_tensor(t) is True
    assert h.free_cpu_locked_tensor(t) is False  # freed already
    assert h.free_cpu_locked_tensor(torch.zeros(4)) is False  # never locked here
    t.fill_(1)  # the memory lives while the tensor does
    assert float(t.float().sum()) == 16.0
