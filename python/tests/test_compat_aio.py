"""zinfinity.compat.deepspeed's aio_handle, op builders and install(): DeepSpeed's defaults,
methods and return codes; every CPU tensor accepted, through a counted bounce where needed."""

import os
import sys

import pytest
import torch

from zinfinity.compat import deepspeed as ds
from zinfinity.io import AsyncIOHandle


def random_bytes(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data.numpy().tobytes())


def test_handle_has_deepspeeds_defaults_and_positional_order():
    h = ds.AsyncIOBuilder().load().aio_handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism()) == (1048576, 128, False, False,
                                                                      1)
    h = ds.aio_handle(1024, 2, True, True, 2)
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism()) == (1024, 2, True, True, 2)
    assert h.get_alignment() == 1024  # DeepSpeed's intra_op_parallelism * 512
    assert ds.aio_handle(num_threads=3).get_intra_op_parallelism() == 3  # the older name


def test_return_codes(workdir, capsys):
    h = ds.aio_handle(1024, 2, False, False, 2)
    path = os.path.join(workdir, "codes.bin")
    data = random_bytes(4096, 1)
    assert h.sync_pwrite(data, path) == 1
    back = torch.empty(4096, dtype=torch.uint8)
    assert h.sync_pread(back, path) == 1 and torch.equal(back, data)
    assert h.async_pread(back, path) == 0 and h.async_pwrite(data, path) == 0
    assert h.wait() == 2
    assert h.async_pwrite(data, path) == 0
    assert h.sync_pread(back, path) == 2  # a sync call also completes what was pending
    assert h.async_pread(back, os.path.join(workdir, "missing.bin")) == -1
    assert h.sync_pread(back, os.path.join(workdir, "missing.bin")) == -1
    assert h.sync_pwrite(data, os.path.join(workdir, "no-dir", "x.bin")) == -1
    assert h.sync_pread(back, path, 1) == -1  # one byte past the end
    assert h.sync_pread(torch.empty(4097, dtype=torch.uint8), path) == -1
    out = capsys.readouterr().out
    assert "fstat for read failed" in out and "file bytes 4097 > 4096" in out
    assert h.wait() == 0


def test_writes_never_truncate(workdir):
    h = ds.aio_handle()
    path = os.path.join(workdir, "keep.bin")
    data = random_bytes(10000, 2)
    assert h.sync_pwrite(data, path) == 1
    assert h.sync_pwrite(data[:100].clone(), path) == 1
    assert os.path.getsize(path) == 10000


def test_fd_overloads_write_and_read_the_descriptors_file(workdir):
    h = ds.aio_handle(1024, 2, False, False, 2)
    path = os.path.join(workdir, "fd.bin")
    data = random_bytes(8192, 3)
    fd = os.open(path, os.O_DIRECT | os.O_CREAT | os.O_WRONLY)
    try:
        assert h.async_pwrite(buffer=data[:4096], fd=fd, file_offset=0) == 0
        assert h.async_pwrite(data[4096:], fd, 4096) == 0  # the int where the name goes
        assert h.wait() == 2
        assert h.sync_pwrite(data[:100], fd=fd, file_offset=0) == 1
        with pytest.raises(ValueError, match="write-only"):
            h.sync_pread(torch.empty(10, dtype=torch.uint8), fd=fd)
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        back = torch.empty(8192, dtype=torch.uint8)
        assert h.sync_pread(back, fd=fd) == 1
        assert torch.equal(back, data)
        with pytest.raises(ValueError, match="read-only"):
            h.async_pwrite(data, fd=fd)
        with pytest.raises(ValueError, match="exactly one"):
            h.async_pread(back, path, fd=fd)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="not an open file descriptor"):
        h.async_pread(back, fd=fd)


def test_a_descriptor_of_a_deleted_file_is_refused(workdir):
    h = AsyncIOHandle()
    path = os.path.join(workdir, "gone.bin")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    os.unlink(path)
    try:
        with pytest.raises(ValueError, match="no longer at"):
            h.async_pwrite(random_bytes(10, 4), fd=fd)
    finally:
        os.close(fd)
    assert not os.path.exists(path)


def test_symbolic_links_stay_refused(workdir):
    h = ds.aio_handle()
    target = os.path.join(workdir, "target.bin")
    link = os.path.join(workdir, "link.bin")
    write_file(target, random_bytes(4096, 5))
    os.symlink(target, link)
    with pytest.raises(ValueError, match="symbolic link; refusing to follow it"):
        h.sync_pwrite(random_bytes(4096, 6), link)
    with pytest.raises(ValueError, match="symbolic link"):
        h.sync_pread(torch.empty(4096, dtype=torch.uint8), link)
    assert h.wait() == 0


def test_read_write_pread_pwrite_with_validate_and_async(workdir):
    h = ds.aio_handle(4096, 4, False, False, 1)
    path = os.path.join(workdir, "rw.bin")
    data = random_bytes(50000, 7)
    assert h.write(data, path, True) == 0
    back = torch.empty_like(data)
    assert h.read(back, path, True) == 0 and torch.equal(back, data)
    assert h.pwrite(data, path, False, True, 50000) == 0  # async: positional, as DeepSpeed's
    assert h.wait() == 1
    assert h.pread(back, path, True, False, 50000) == 1
    assert h.pread(back, path, False, **{"async": True}) == 0
    assert h.wait() == 1 and torch.equal(back, data)
    with pytest.raises(TypeError, match="unexpected"):
        h.pread(back, path, False, False, 0, bogus=1)


def test_validate_names_a_difference(workdir, monkeypatch, capsys):
    from zinfinity import CorruptionError
    from zinfinity.compat import _aio

    h = ds.aio_handle()
    path = os.path.join(workdir, "validate.bin")
    data = random_bytes(4096, 10)
    assert h.write(data, path, True) == 0
    # The buffered read of the check sees one byte changed (as a lost write would show).
    real = _aio._file_bytes
    monkeypatch.setattr(_aio, "_file_bytes",
                        lambda *a: bytes([real(*a)[0] ^ 1]) + real(*a)[1:])
    assert h.write(data, path, True) == -1
    assert "differs from a buffered read" in capsys.readouterr().out
    assert h.pread(torch.empty(4096, dtype=torch.uint8), path, True, True, 0) == 0
    with pytest.raises(CorruptionError, match=r"read of 4096 bytes at offset 0 of .*validate"):
        h.wait()
    assert h.wait() == 0


def test_every_address_of_a_plain_tensor_round_trips(workdir):
    """The bounce path: a byte view at every offset 0..511 of a plain tensor, written and read
    back, against the bytes written through the page cache."""
    h = ds.aio_handle(1 << 16, 8, False, False, 1)
    path = os.path.join(workdir, "sweep.bin")
    size = 3000
    source = random_bytes(size + 1024, 8)
    write_file(path, source)
    plain = torch.zeros(size + 1024, dtype=torch.uint8)
    bounced_before = h.bounce_stats()["bounces"]
    for offset in range(512):
        view = plain[offset:offset + size]
        assert h.sync_pread(view, path, offset) == 1
        assert torch.equal(view, source[offset:offset + size]), offset
        view.copy_(random_bytes(size, offset))
        assert h.sync_pwrite(view, path, offset) == 1
        with open(path, "rb") as f:
            f.seek(offset)
            assert f.read(size) == view.numpy().tobytes(), offset
        source[offset:offset + size] = view
    stats = h.bounce_stats()
    if h._h.is_direct(path):
        # Only the addresses off the file's alignment bounce, and each is counted with its
        # bytes (a read counts its copy out, a write its copy in).
        assert stats["bounces"] > bounced_before
        assert stats["bytes"] == size * stats["bounces"]
    assert stats["cached_bytes"] <= 64 << 20


def test_strided_tensors_are_accepted(workdir):
    h = ds.aio_handle()
    path = os.path.join(workdir, "strided.bin")
    matrix = torch.randn(64, 32)
    assert h.sync_pwrite(matrix.t(), path) == 1
    back = torch.empty(32, 64)
    assert h.sync_pread(back, path) == 1
    assert torch.equal(back, matrix.t())
    into = torch.empty(64, 32).t()
    assert h.sync_pread(into, path) == 1 and torch.equal(into, matrix.t())


def test_locked_tensors_are_shared_by_the_process():
    a, b = ds.aio_handle(), ds.aio_handle()
    t = a.new_cpu_locked_tensor(1024, torch.empty(0, dtype=torch.uint8))
    assert t.data_ptr() % 4096 == 0
    assert a.is_pinned(t) and b.is_pinned(t[100:200])  # slices count
    assert not b.is_pinned(torch.empty(10))
    assert b.new_cpu_locked_tensor(4, example_tenosr=torch.empty(0)).dtype == torch.float32
    assert b.free_cpu_locked_tensor(t) is True  # freed by another handle
    assert a.free_cpu_locked_tensor(t) is False and not a.is_pinned(t)
    assert a.free_cpu_locked_tensor(torch.empty(3)) is False


def test_module_functions(workdir, capsys):
    op = ds.AsyncIOBuilder().load()
    path = os.path.join(workdir, "module.bin")
    data = random_bytes(5000, 9)
    assert op.aio_write(data, path, 1 << 20, 8, False, False, True) == 0
    back = torch.empty(5000, dtype=torch.uint8)
    assert op.aio_read(back, path, 1 << 20, 8, False, False, True) == 0
    assert torch.equal(back, data)
    assert op.aio_read(back, os.path.join(workdir, "none"), 1 << 20, 8, False, False,
                       False) == -1
    assert op.aio_read(back[:10], path, 1 << 20, 8, False, False, False) == -1
    dest = torch.zeros(7)
    assert op.deepspeed_memcpy(dest, torch.arange(7.0)) == 0
    assert torch.equal(dest, torch.arange(7.0))
    with pytest.raises(ValueError, match="elements"):
        op.deepspeed_memcpy(dest, torch.zeros(3))


def test_builders_have_deepspeeds_names():
    for builder, name, functions in [
            (ds.CPUAdamBuilder, "cpu_adam",
             ["create_adam", "adam_update", "adam_rollback", "destroy_adam"]),
            (ds.CPUAdagradBuilder, "cpu_adagrad",
             ["create_adagrad", "adagrad_update", "destroy_adagrad"]),
            (ds.CPULionBuilder, "cpu_lion", ["create_lion", "lion_update", "destroy_lion"]),
            (ds.AsyncIOBuilder, "async_io",
             ["aio_handle", "aio_read", "aio_write", "deepspeed_memcpy"])]:
        assert builder.NAME == name and builder().is_compatible()
        module = builder().load()
        assert module is builder().jit_load()
        for f in functions:
            assert callable(getattr(module, f)), f


def test_install_maps_deepspeeds_modules(monkeypatch):
    for name in list(sys.modules):
        if name == "deepspeed" or name.startswith("deepspeed."):
            monkeypatch.delitem(sys.modules, name)
    ops = ds.install()
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        from deepspeed.ops.lion import DeepSpeedCPULion
        import deepspeed.ops.aio

        assert DeepSpeedCPUAdam is ds.DeepSpeedCPUAdam
        assert DeepSpeedCPUAdagrad is ds.DeepSpeedCPUAdagrad
        assert DeepSpeedCPULion is ds.DeepSpeedCPULion
        assert AsyncIOBuilder is ds.AsyncIOBuilder is deepspeed.ops.aio.AsyncIOBuilder
        assert CPUAdamBuilder().load().create_adam is not None
        assert ops.__compatible_ops__["cpu_adam"] and ops.__compatible_ops__["async_io"]
    finally:
        for name in list(sys.modules):
            if name == "deepspeed" or name.startswith("deepspeed."):
                del sys.modules[name]
