"""zinfinity.offload.NVMeOptimizer: training in PyTorch with the states on NVMe."""

import copy
import os

import pytest
import torch

import zinfinity
from zinfinity.offload import NVMeOptimizer


def test_fashion_mnist_mlp_trains_as_torch_adamw_for_300_steps(workdir, example):
    torch.manual_seed(1234)
    train_loader, _ = example.load_data(batch_size=128, seed=1234)
    ours_model = example.CustomModel()
    ref_model = copy.deepcopy(ours_model)
    # 512 Ki parameters per sub-group: the 1.86 M parameters stream in 4 sub-groups, two of which
    # span tensors (the gather / scatter path) and two lie inside the first weight.
    ours = NVMeOptimizer(ours_model.parameters(), optimizer="adamw", nvme_path=workdir,
                         sub_group_size=1 << 19, lr=1e-3, weight_decay=0.01)
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-3, weight_decay=0.01)
    assert ours._native.sub_group_count(0) == 4
    n = sum(p.numel() for p in ours_model.parameters())
    assert ours._native.bytes_on_disk >= 3 * 4 * n  # master + two moments
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = iter(train_loader)
    worst, first, last = 0.0, None, None
    for step in range(300):
        images, labels = next(batches)
        losses = []
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            loss = loss_fn(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        rel = abs(losses[0] - losses[1]) / abs(losses[1])
        worst = max(worst, rel)
        assert rel <= 1e-5, f"step {step}: loss {losses[0]} vs torch.optim.AdamW's {losses[1]}"
        first = first if first is not None else losses[1]
        last = losses[1]
        s = ours.last_step_stats[0]
        assert s["bytes_read"] >= 3 * 4 * n and s["bytes_written"] >= 3 * 4 * n
    assert last < 0.7 * first  # it learned
    print(f"worst relative loss difference over 300 steps: {worst:.3g}")


def test_a_corrupted_swap_byte_raises_naming_the_partition(workdir):
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 200)
    opt = NVMeOptimizer(model.parameters(), nvme_path=workdir, sub_group_size=1 << 14)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    (path,) = opt.swap_files()
    with open(path, "r+b") as f:
        f.seek(100_000)
        byte = f.read(1)
        f.seek(100_000)
        f.write(bytes([byte[0] ^ 0x40]))
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(zinfinity.CorruptionError, match=r"checksum mismatch in partition \d+"):
        opt.step()
    assert issubclass(zinfinity.CorruptionError, OSError)


def test_state_dict_streams_torch_layout_and_round_trips(workdir):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(50, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))
    ref_model = copy.deepcopy(model)
    opt = NVMeOptimizer([{"params": model[0].parameters()},
                         {"params": model[2].parameters(), "lr": 5e-3, "weight_decay": 0.0}],
                        nvme_path=workdir, sub_group_size=777)
    ref = torch.optim.AdamW([{"params": ref_model[0].parameters()},
                             {"params": ref_model[2].parameters(), "lr": 5e-3, "weight_decay": 0.0}])
    x = torch.randn(64, 50)
    y = torch.randint(0, 3, (64,))

    def train(m, o, steps):
        for _ in range(steps):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()

    train(model, opt, 5)
    train(ref_model, ref, 5)
    sd, td = opt.state_dict(), ref.state_dict()
    assert sd["state"].keys() == td["state"].keys()
    for k, t in td["state"].items():
        assert set(sd["state"][k]) == set(t)
        assert float(sd["state"][k]["step"]) == float(t["step"]) == 5.0
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sd["state"][k][name], t[name], rtol=2e-6, atol=1e-9)
    assert [g["lr"] for g in sd["param_groups"]] == [1e-3, 5e-3]

    # Into a fresh NVMeOptimizer: the same continuation, bitwise.
    clone = copy.deepcopy(model)
    again = NVMeOptimizer([{"params": clone[0].parameters()}, {"params": clone[2].parameters()}],
                          nvme_path=workdir, sub_group_size=777)
    again.load_state_dict(sd)
    assert again.param_groups[1]["lr"] == 5e-3
    # And torch's state_dict into an NVMeOptimizer: the same layout.
    from_torch_model = copy.deepcopy(ref_model)
    from_torch = NVMeOptimizer([{"params": from_torch_model[0].parameters()},
                                {"params": from_torch_model[2].parameters()}],
                               nvme_path=workdir, sub_group_size=777)
    from_torch.load_state_dict(td)
    train(model, opt, 3)
    train(clone, again, 3)
    train(ref_model, ref, 3)
    train(from_torch_model, from_torch, 3)
    for p, q, r, s in zip(model.parameters(), clone.parameters(), ref_model.parameters(),
                          from_torch_model.parameters()):
        assert torch.equal(p, q)
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(s, r, rtol=1e-5, atol=1e-6)


def test_bf16_parameters_keep_their_fp32_master_on_disk(workdir):
    torch.manual_seed(2)
    w = torch.randn(1000, 37).to(torch.bfloat16).requires_grad_(True)
    ref = w.detach().float().requires_grad_(True)
    opt = NVMeOptimizer([w], nvme_path=workdir, sub_group_size=4096, weight_decay=0.0)
    ref_opt = torch.optim.AdamW([ref], weight_decay=0.0)
    for _ in range(10):
        g = torch.randn(1000, 37).to(torch.bfloat16)
        w.grad = g
        ref.grad = g.float()
        opt.step()
        ref_opt.step()
    master = opt.state_dict()["state"][0]["master"]
    torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(w.detach(), master.to(torch.bfloat16))


@pytest.mark.parametrize("kind,reference", [("adagrad", torch.optim.Adagrad), ("adam", torch.optim.Adam)])
def test_other_optimizers(workdir, kind, reference):
    torch.manual_seed(3)
    a = torch.randn(3001, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    opt = NVMeOptimizer([a], optimizer=kind, nvme_path=workdir, sub_group_size=1000,
                        lr=0.01, weight_decay=0.01)
    ref = reference([b], lr=0.01, weight_decay=0.01)
    for _ in range(20):
        g = torch.randn(3001)
        a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bad_input_is_refused_with_a_clear_error(workdir):
    p = torch.randn(100, requires_grad=True)
    q = torch.randn(10, requires_grad=True)
    with pytest.raises(ValueError, match="nvme_path is required"):
        NVMeOptimizer([p])
    with pytest.raises(FileNotFoundError, match="not a directory"):
        NVMeOptimizer([p], nvme_path=os.path.join(workdir, "missing"))
    with pytest.raises(ValueError, match="unknown aio key 'queue_dept'"):
        NVMeOptimizer([p], nvme_path=workdir, aio={"queue_dept": 8})
    with pytest.raises(ValueError, match="optimizer 'sgd'"):
        NVMeOptimizer([p], optimizer="sgd", nvme_path=workdir)
    with pytest.warns(UserWarning, match="use_gds is not implemented"):
        NVMeOptimizer([p], nvme_path=workdir, aio={"use_gds": True}).close()
    opt = NVMeOptimizer([p, q], nvme_path=workdir, aio={"block_size": 1 << 16, "thread_count": 2})
    p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="parameter 1 of group 0 has no gradient"):
        opt.step()
    q.grad = torch.ones_like(q)
    before = p.detach().clone()
    opt.step()  # the refused step changed nothing and did not count
    assert float(opt.state_dict()["state"][0]["step"]) == 1.0
    assert not torch.equal(p, before)
    with pytest.raises(ValueError, match="fixed when it is created"):
        opt.add_param_group({"params": [torch.zeros(3, requires_grad=True)]})


def test_close_removes_the_swap_files(workdir):
    p = torch.randn(100, requires_grad=True)
    with NVMeOptimizer([p], nvme_path=workdir) as opt:
        (path,) = opt.swap_files()
        assert os.path.exists(path)
        assert os.path.dirname(os.path.dirname(os.path.dirname(path))) == workdir
    assert not os.path.exists(path)
    assert os.listdir(workdir) == []
    with pytest.raises(RuntimeError, match="closed"):
        opt.step()


def test_a_full_disk_is_refused_before_anything_is_written():
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    import subprocess
    import tempfile

    mount = tempfile.mkdtemp(prefix="zinf-py-tiny-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", mount]).returncode != 0:
        os.rmdir(mount)
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = torch.zeros(1_000_000, requires_grad=True)  # 12 MB of master and moments
        with pytest.raises(OSError, match=r"not enough space .* need 11\.45 MiB"):
            NVMeOptimizer([p], nvme_path=mount)
        assert os.listdir(mount) == []  # its directory is gone again
    finally:
        subprocess.run(["umount", mount], check=True)
        os.rmdir(mount)


def test_load_state_dict_checks_everything_before_writing(workdir):
    torch.manual_seed(4)
    a = torch.randn(500, requires_grad=True)
    b = torch.randn(300, requires_grad=True)
    opt = NVMeOptimizer([{"params": [a]}, {"params": [b]}], nvme_path=workdir, sub_group_size=128)
    a.grad, b.grad = torch.randn(500), torch.randn(300)
    opt.step()
    before = opt.state_dict()
    bad = copy.deepcopy(before)
    bad["state"][1]["exp_avg"] = torch.zeros(299)  # group 1 is wrong, group 0 is fine
    with pytest.raises(ValueError, match="exp_avg of parameter 0 of group 1 has 299 elements"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(before)
    bad["param_groups"][0]["amsgrad"] = True
    with pytest.raises(ValueError, match="amsgrad=True; this optimizer was created with amsgrad=False"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(before)
    bad["state"][0]["master"] = torch.zeros(5)
    bad["state"][0]["exp_avg"] = torch.zeros(500)
    with pytest.raises(ValueError, match="the master of parameter 0 of group 0 has 5 elements"):
        opt.load_state_dict(bad)
    after = opt.state_dict()  # nothing was written by the refused loads
    for k in before["state"]:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(before["state"][k][name], after["state"][k][name])


def test_a_group_with_an_empty_parameter_steps(workdir):
    e = torch.zeros(0, requires_grad=True)
    w = torch.randn(100, requires_grad=True)
    opt = NVMeOptimizer([e, w], nvme_path=workdir)
    w.grad = torch.ones(100)
    e.grad = torch.zeros(0)
    before = w.detach().clone()
    opt.step()
    assert not torch.equal(w, before)


@pytest.mark.parametrize("state_dtype,ratio", [("bf16", 8 / 12), ("int8", 6.004 / 12)])
def test_compressed_states_take_fewer_bytes_train_close_and_reproducibly(workdir, state_dtype,
                                                                          ratio):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(128, 384), torch.nn.Tanh(),
                                torch.nn.Linear(384, 4))
    x = torch.randn(256, 128)
    y = torch.randint(0, 4, (256,))

    def run(dtype):
        m = copy.deepcopy(model)
        opt = NVMeOptimizer(m.parameters(), nvme_path=workdir, sub_group_size=16384, lr=3e-3,
                            state_dtype=dtype)
        losses = []
        for _ in range(40):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return m, opt, losses

    exact, exact_opt, exact_losses = run("fp32")
    a, opt_a, losses_a = run(state_dtype)
    b, _, losses_b = run(state_dtype)
    assert opt_a.state_dtype == state_dtype and exact_opt.state_dtype == "fp32"
    # Fewer bytes on disk, as the dtype says (the sub-groups are whole 2048-element blocks).
    n = sum(p.numel() for p in model.parameters())
    assert opt_a.bytes_on_disk < exact_opt.bytes_on_disk * (ratio + 0.05)
    assert opt_a.bytes_on_disk >= n * 12 * ratio
    # Run to run: the same bits (the rounding words are keyed by index and step).
    assert losses_a == losses_b
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    # Close to the exact states' run, and not the same run (the compression took effect).
    assert abs(losses_a[-1] - exact_losses[-1]) < 0.05 * exact_losses[0]
    assert losses_a != exact_losses
    # state_dict -> load_state_dict into a fresh optimizer continues bit for bit.
    clone = copy.deepcopy(a)
    again = NVMeOptimizer(clone.parameters(), nvme_path=workdir, sub_group_size=16384, lr=3e-3,
                          state_dtype=state_dtype)
    saved = opt_a.state_dict()
    again.load_state_dict(saved)
    # The moments read back are the stored values: written again, they read back unchanged.
    back = again.state_dict()["state"]
    for k, entry in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(back[k][name], entry[name])
    for m, o in ((a, opt_a), (clone, again)):
        for _ in range(3):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for p, q in zip(a.parameters(), clone.parameters()):
        assert torch.equal(p, q)


def test_compressed_states_refuse_torch_rounding_and_unknown_dtypes(workdir):
    p = torch.randn(100, requires_grad=True)
    with pytest.raises(ValueError, match="torch_rounding is defined for fp32 states only"):
        NVMeOptimizer([p], nvme_path=workdir, state_dtype="int8", torch_rounding=True)
    with pytest.raises(ValueError, match="state_dtype 'fp8'"):
        NVMeOptimizer([p], nvme_path=workdir, state_dtype="fp8")
