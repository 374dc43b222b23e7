"""zinfinity.initialize: a torch model trained by the C++ engine with DeepSpeed's calls."""

import copy
import json
import os
import warnings

import pytest
import torch
from torch import nn

import zinfinity


def mlp(seed=7, hidden=48):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def batches(n, rows=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 64, generator=g)
    out = []
    for _ in range(n):
        y = torch.randint(0, 10, (rows,), generator=g)
        x = centers[y] + 0.5 * torch.randn(rows, 64, generator=g)
        out.append((x, y))
    return out


def config(workdir, stage=0, optimizer=None, param=None, **extra):
    zero = {"stage": stage}
    if stage == 3:  # every parameter gathered and released around each use (none persistent)
        zero["stage3_param_persistence_threshold"] = 0
    if optimizer:
        zero["offload_optimizer"] = {"device": optimizer, "nvme_path": workdir}
    if param:
        zero["offload_param"] = {"device": param, "nvme_path": workdir}
    c = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01,
                                                   "torch_rounding": True}},
         "zero_optimization": zero, "steps_per_print": 1000}
    c.update(extra)
    return c


# Every stage x placement the config accepts: offload_optimizer from stage 1, offload_param at 3.
PLACEMENTS = [(0, None, None), (1, None, None), (1, "cpu", None), (1, "nvme", None),
              (2, "cpu", None), (2, "nvme", None), (3, None, None), (3, "cpu", None),
              (3, "nvme", "cpu"), (3, "nvme", "nvme")]


def train(model, cfg, data, engine_out=None):
    engine, _, _, _ = zinfinity.initialize(model=model, config=cfg)
    losses = []
    for x, y in data:
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if engine_out is not None:
        engine_out.append(engine)
    else:
        engine.close()
    return losses


def torch_losses(model, data, lr=1e-3, weight_decay=0.01):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for x, y in data:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_every_placement_takes_torch_adamws_steps_bitwise(workdir):
    data = batches(30)
    reference = torch_losses(mlp(), data)
    assert reference[-1] < 0.7 * reference[0]  # it learns
    for stage, opt, param in PLACEMENTS:
        engines = []
        got = train(mlp(), config(workdir, stage, opt, param), data, engines)
        figures = engines[0].figures()
        engines[0].close()
        assert got == reference, (stage, opt, param)
        want_states = {None: "device", "cpu": "cpu", "nvme": "nvme"}[opt]
        assert figures["optimizer_states"] == want_states, (stage, opt, figures)
        if param is not None:
            assert figures["parameters"] == param
        if opt == "nvme" or param == "nvme":
            assert figures["bytes_read"] > 0 and figures["bytes_written"] > 0
        assert not [f for f in os.listdir(workdir) if f != "zinfinity-swap.lock"], "swap files left"


def test_stage3_empties_released_parameters_and_fetches_per_module(workdir):
    model = mlp()
    engine, _, _, _ = zinfinity.initialize(model=model, config=config(workdir, 3, "nvme", "nvme"))
    try:
        assert all(p.numel() == 0 for p in model.parameters())  # partitioned, released
        (x, y), = batches(1)
        seen = []
        hook = model[2].register_forward_pre_hook(
            # dict.get: a look that does not fetch (attribute reads in a forward do)
            lambda m, i: seen.append((m.weight.numel(), model[0]._parameters.get("weight").numel())))
        loss = nn.functional.cross_entropy(engine(x), y)
        hook.remove()
        assert seen == [(48 * 48, 0)]  # the module's own, gathered; the one before, released
        before = engine.figures()["fetch_count"]
        engine.backward(loss)
        engine.step()
        assert engine.figures()["fetch_count"] - before == 6  # each parameter again in backward
        assert all(p.numel() == 0 for p in model.parameters())
        engine.eval()
        with torch.no_grad():  # an evaluation forward: gathered and released as in training
            evaluated = engine(x)
        engine.train()
        assert all(p.numel() == 0 for p in model.parameters())
        sd = model.state_dict()  # gathered, whole
        assert sd["0.weight"].shape == (48, 64) and sd["0.weight"].abs().sum() > 0
        plain = mlp()
        plain.load_state_dict(sd)
        assert torch.equal(plain(x), evaluated)
    finally:
        engine.close()
    assert model[0].weight.shape == (48, 64)  # the last values are torch's again


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, a frozen layer, a module called
    twice and a parameter read outside its module."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.emb = nn.Embedding(20, 16)
        self.mid = nn.Linear(16, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.scale = nn.Linear(1, 16)

    def forward(self, tokens):
        h = self.emb(tokens)
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.mid(h))  # called twice
        h = self.frozen(h) * self.scale.weight.view(16)  # read outside its module
        return h @ self.emb.weight.t()  # tied output layer


def tied_losses(train_step, model, steps=12):
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        t = torch.randint(0, 20, (8, 6), generator=g)
        logits = model(t) if train_step is None else train_step[0](t)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 20), t.roll(1, 1).reshape(-1))
        train_step[1](loss) if train_step is not None else None
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("stage,opt,param", [(0, None, None), (3, None, None),
                                             (3, "nvme", "nvme")])
def test_tied_frozen_reused_and_outside_parameters_match_torch(workdir, stage, opt, param):
    ref = Tied()
    frozen_before = ref.frozen.weight.detach().clone()
    torch_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-3,
                                  weight_decay=0.01)

    def torch_step(loss):
        torch_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch_opt.step()

    want = tied_losses((ref, torch_step), ref)
    model = Tied()
    cfg = config(workdir, stage, opt, param, train_micro_batch_size_per_gpu=8)
    engine, _, _, _ = zinfinity.initialize(model=model, config=cfg)

    def step(loss):
        engine.backward(loss)
        engine.step()

    got = tied_losses((engine, step), model)
    residency = engine.figures()["residency"]
    engine.close()
    assert got == want
    if param == "nvme":
        # Parameters read outside their module (scale.weight, the tied emb.weight) are fetched
        # where they are read in every window, as in the first: the recorded trace holds.
        assert "traces 1, order changes 0" in residency, residency
    assert torch.equal(model.frozen.weight, frozen_before)  # never written
    assert torch.equal(model.emb.weight, ref.emb.weight)


def test_gradient_accumulation_and_counters(workdir):
    data = batches(8, rows=8)
    cfg = config(workdir, 2, "cpu", None, train_micro_batch_size_per_gpu=8,
                 gradient_accumulation_steps=4)
    engine, opt, loader, sched = zinfinity.initialize(model=mlp(), config=cfg)
    assert (engine.train_batch_size(), engine.gradient_accumulation_steps()) == (32, 4)
    assert loader is None and sched is None
    applied = []
    for i, (x, y) in enumerate(data):
        assert engine.is_gradient_accumulation_boundary() == (i % 4 == 3)
        loss = nn.functional.cross_entropy(engine(x), y)
        assert engine.backward(loss).item() == (loss.detach() / 4).item()  # DeepSpeed's return
        engine.step()
        applied.append(engine.was_step_applied())
    assert applied == [False, False, False, True] * 2
    assert (engine.global_steps, engine.micro_steps, engine.global_samples) == (2, 8, 64)
    engine.close()


def test_checkpoint_round_trip_resumes_bitwise_with_client_state(workdir):
    data = batches(12)
    ckpt = os.path.join(workdir, "ckpt")
    nvme = os.path.join(workdir, "nvme")
    os.makedirs(nvme)
    cfg = config(nvme, 3, "nvme", "nvme")
    straight = train(mlp(), cfg, data)

    engine, _, _, _ = zinfinity.initialize(model=mlp(), config=cfg)
    for x, y in data[:6]:
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        engine.step()
    assert engine.save_checkpoint(ckpt, client_state={"epoch": 3, "note": "x"})
    engine.close()
    assert open(os.path.join(ckpt, "latest")).read().strip() == "global_step6"

    model = mlp(seed=99)  # other initial values: the checkpoint's must win
    engine, _, _, _ = zinfinity.initialize(model=model, config=cfg)
    path, client = engine.load_checkpoint(ckpt)
    assert path == os.path.join(ckpt, "global_step6") and client == {"epoch": 3, "note": "x"}
    assert engine.global_steps == 6
    resumed = []
    for x, y in data[6:]:
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        resumed.append(loss.item())
    engine.close()
    assert resumed == straight[6:]

    out = os.path.join(workdir, "weights.pt")
    zinfinity.checkpoint.consolidate(ckpt, out)
    sd = torch.load(out)
    fresh = mlp(seed=5)
    fresh.load_state_dict(sd)
    engine, _, _, _ = zinfinity.initialize(model=mlp(seed=99), config=cfg)
    engine.load_checkpoint(ckpt)
    for name, p in engine.module.state_dict().items():
        assert torch.equal(p, sd[name]), name
    engine.close()


def test_bad_input_is_refused_by_name(workdir):
    with pytest.raises(ValueError, match="no config"):
        zinfinity.initialize(model=mlp())
    with pytest.raises(ValueError, match=r"zero_optimization\.stagee|stagee"):
        zinfinity.initialize(model=mlp(), config={"train_batch_size": 4,
                                                  "zero_optimization": {"stagee": 1}})
    model = mlp()
    engine, _, _, _ = zinfinity.initialize(model=model, config=config(workdir, 3))
    (x, y), = batches(1)
    with pytest.raises(ValueError, match="no backward since the last step"):
        engine.step()
    loss = nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    with pytest.raises(ValueError, match="called twice without step"):
        engine.backward(loss)
    engine.step()
    model.extra = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="extra.weight was added to the model after initialize"):
        engine(x)
    del model.extra
    other = os.path.join(workdir, "other")
    with pytest.raises(ValueError, match=r"parameter weight is on meta"):
        zinfinity.initialize(model=nn.Linear(3, 3, device="meta"), config=config(workdir, 0))
    small = nn.Linear(4, 4)
    e3, _, _, _ = zinfinity.initialize(model=small, config=config(workdir, 0))
    small.weight.data = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"parameter weight has shape \(2, 2\), registered as "
                                         r"\(4, 4\)"):
        e3(torch.zeros(1, 4))
    e3.close()
    e2, _, _, _ = zinfinity.initialize(model=nn.Linear(5, 5), config=config(workdir, 0))
    e2.save_checkpoint(other, tag="t")
    e2.close()
    with pytest.raises(ValueError, match="another model"):
        engine.load_checkpoint(other, tag="t")
    assert engine.global_steps == 1  # nothing loaded
    engine.close()
    assert [f for f in os.listdir(workdir) if f.startswith("zinf-run")] == []


def vm_flags_at(address):
    """The VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not line.startswith("VmFlags"):
                try:
                    lo, hi = (int(v, 16) for v in head.split("-"))
                except ValueError:
                    continue
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=96):
        g = torch.Generator().manual_seed(9)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("stage,opt,param", [(0, None, None), (2, "nvme", None),
                                             (3, "nvme", "nvme")])
def test_forked_dataloader_workers_leave_the_engine_alone(workdir, stage, opt, param):
    """training_data gives a DataLoader of this rank's micro-batches; with num_workers=2 (fork)
    it trains as with none, and the engine's buffers are not inherited by the workers."""
    runs = []
    for workers in (0, 2):
        model = mlp(hidden=1024)  # a 1 MiB weight: its own pages in the engine
        engine, _, loader, _ = zinfinity.initialize(
            model=model, config=config(workdir, stage, opt, param), training_data=Pairs())
        assert len(loader) == 6 and loader.batch_size == 16
        loader = engine.deepspeed_io(Pairs(), num_local_io_workers=workers)
        losses = []
        for x, y in loader:
            loss = nn.functional.cross_entropy(engine(x), y)
            if stage < 3:
                assert "dc" in vm_flags_at(model[2].weight.data_ptr())  # MADV_DONTFORK
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        engine.close()
        runs.append(losses)
    assert runs[0] == runs[1]


def test_bf16_is_bitwise_across_placements_and_clipping_and_fp16_overflow_skip(workdir):
    data = batches(10)
    results = []
    for stage, opt, param in [(0, None, None), (2, "cpu", None), (3, "nvme", "nvme")]:
        cfg = config(workdir, stage, opt, param, bf16={"enabled": True}, gradient_clipping=0.5)
        results.append(train(mlp(), cfg, data))
    assert results[0] == results[1] == results[2]
    fp32 = train(mlp(), config(workdir, 0), data)
    assert results[0] != fp32  # bf16 rounding happened
    # fp16 with a huge initial scale: the first steps overflow and are skipped, the scale drops
    cfg = config(workdir, 2, "cpu", None, fp16={"enabled": True, "initial_scale_power": 60,
                                                "loss_scale_window": 1000})
    engine, opt, _, _ = zinfinity.initialize(model=mlp(), config=cfg)
    applied = []
    for x, y in data[:4]:
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        engine.step()
        applied.append(engine.was_step_applied())
    assert applied[0] is False and engine.skipped_steps >= 1 and opt.loss_scale < 2.0 ** 60
    engine.close()


@pytest.mark.parametrize("param", [None, "nvme"])
def test_optimizer_step_beside_backward_is_bitwise_the_sequential_one(workdir, param):
    # swap.overlap_step through the front end's hooks: the same losses with and without it,
    # every window after the recorded one speculated and committed (no clipping).
    data = batches(12)
    runs = []
    for overlap in (False, True):
        cfg = config(workdir, 3, "nvme", param, bf16={"enabled": True},
                     swap={"overlap_step": overlap})
        cfg["zero_optimization"]["offload_optimizer"]["stream_gradients"] = False
        cfg["zero_optimization"]["sub_group_size"] = 1024
        engines = []
        runs.append(train(mlp(), cfg, data, engines))
        figures = engines[0].figures()
        engines[0].close()
        if overlap:
            counts = figures["overlap_step"]
            assert counts["recorded"] == 1 and counts["committed"] == len(data) - 1, counts
            assert counts["redone"] == counts["skipped"] == counts["abandoned"] == 0, counts
        else:
            assert "overlap_step" not in figures
    assert runs[0] == runs[1]


def test_client_lr_scheduler_and_optimizer_translate_into_the_engine(workdir):
    data = batches(6)
    model = mlp()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    want = []
    for x, y in data:
        loss = nn.functional.cross_entropy(ref(x), y)
        ref_opt.zero_grad()
        loss.backward()
        ref_opt.step()
        ref_sched.step()
        want.append(loss.item())
    cfg = config(workdir, 1, "cpu", None)
    del cfg["optimizer"]
    client = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    engine, opt, _, sched = zinfinity.initialize(
        model=model, config=cfg, optimizer=client,
        lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5))
    got, lrs = [], []
    for x, y in data:
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        got.append(loss.item())
        lrs.append(engine.get_lr()[0])
    engine.close()
    assert lrs == [1e-2, 5e-3, 5e-3, 2.5e-3, 2.5e-3, 1.25e-3]
    for a, b in zip(got, want):  # the engine's AdamW (no torch_rounding key here): close
        assert abs(a - b) <= 1e-5 * abs(b)
    with pytest.raises(ValueError, match="SGD"):
        zinfinity.initialize(model=mlp(), config=cfg,
                             optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1))


def test_zero_init_builds_a_model_whose_parameters_wait_in_a_file(workdir):
    cfg = config(workdir, 3, "nvme", "nvme")
    torch.manual_seed(7)
    with zinfinity.zero.Init(config=cfg):
        model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(),
                              nn.Linear(48, 10))
        assert model[0].weight.numel() == 0 and model[0].weight.ds_shape == (48, 64)
    with zinfinity.zero.GatheredParameters(list(model[4].parameters()), modifier_rank=0):
        assert model[4].weight.shape == (10, 48)
        model[4].bias.data.fill_(0.25)
    reference = mlp()  # the same seed, built plainly
    with torch.no_grad():
        reference[4].bias.fill_(0.25)
    data = batches(5)
    want = torch_losses(reference, data)
    engines = []
    assert train(model, cfg, data, engines) == want
    # Under the engine the values are read-only: reading works, a modifier is refused by name
    # (the change would never reach the engine's master), and nothing changed.
    with zinfinity.zero.GatheredParameters([model[4].bias]):
        bias = model[4].bias.detach().clone()
    assert bias.shape == (10,)
    with pytest.raises(RuntimeError, match="modifier_rank"):
        with zinfinity.zero.GatheredParameters([model[4].bias], modifier_rank=0):
            model[4].bias.data.fill_(1.0)
    with zinfinity.zero.GatheredParameters([model[4].bias]):
        assert torch.equal(model[4].bias, bias)
    engines[0].close()


def test_sigterm_closes_the_engine_and_removes_its_swap_files(workdir):
    """A training process stopped by SIGTERM leaves no swap file and dies of the signal."""
    import signal
    import subprocess
    import sys
    import time
    script = f"""
import sys, time, torch, zinfinity
from torch import nn
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_engine import mlp, config, batches
engine, _, _, _ = zinfinity.initialize(model=mlp(), config=config({workdir!r}, 3, "nvme", "nvme"))
print("ready", flush=True)
while True:
    for x, y in batches(4):
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        engine.step()
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    assert [f for f in os.listdir(workdir) if f.startswith("zinf-run")], "no run directory"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == -signal.SIGTERM
    assert [f for f in os.listdir(workdir) if f != "zinfinity-swap.lock"] == []


def test_torch_keeps_its_openblas_threads(workdir):
    """The engine's Compute turns OpenBLAS's threads off for its own GEMM tiles; torch, which
    runs the model's GEMMs through the same OpenBLAS, keeps its count (speed, and the results
    of torch alone: OpenBLAS's partitioning follows its thread count)."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("openblas")
    if name is None:
        pytest.skip("no libopenblas to ask")
    blas = ctypes.CDLL(name)
    blas.openblas_set_num_threads(2)
    engine, _, _, _ = zinfinity.initialize(model=mlp(), config=config(workdir, 2, "cpu"))
    assert blas.openblas_get_num_threads() == 2
    engine.close()


def test_load_state_dict_after_initialize_is_refused_not_lost(workdir):
    model = mlp()
    weights = mlp(seed=3).state_dict()
    engine, _, _, _ = zinfinity.initialize(model=model, config=config(workdir, 1, "cpu"))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="load the weights before initialize"):
        model.load_state_dict(weights)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    engine.close()
    model.load_state_dict(weights)  # torch's own again once the engine is closed


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_compressed_optimizer_states_train_reproducibly_and_resume_bitwise(workdir, state_dtype):
    data = batches(12)
    nvme = os.path.join(workdir, "nvme")
    ckpt = os.path.join(workdir, "ckpt")
    os.makedirs(nvme)

    def cfg(stage, opt, param=None):
        c = config(nvme, stage, opt, param)
        c["optimizer"]["params"]["torch_rounding"] = False
        c["zero_optimization"].setdefault("offload_optimizer", {})["state_dtype"] = state_dtype
        return c

    exact = config(nvme, 3, "nvme", "nvme")
    exact["optimizer"]["params"]["torch_rounding"] = False
    reference = train(mlp(), exact, data)
    engines = []
    first = train(mlp(), cfg(3, "nvme", "nvme"), data, engines)
    figures = engines[0].figures()
    engines[0].close()
    assert figures["optimizer_states"] == "nvme"
    # The states are compressed (the run is not the fp32 one), close to it, and every placement
    # trains the same bits (the blocks and rounding words follow the global index).
    assert first != reference
    assert abs(first[-1] - reference[-1]) < 0.05 * reference[0]
    for stage, opt in ((1, "cpu"), (2, "nvme"), (3, None)):
        assert train(mlp(), cfg(stage, opt), data) == first, (stage, opt)

    # A checkpoint at step 6 resumes bitwise; its moments are saved in their dtype.
    engine, _, _, _ = zinfinity.initialize(model=mlp(), config=cfg(3, "nvme", "nvme"))
    for x, y in data[:6]:
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        engine.step()
    assert engine.save_checkpoint(ckpt)
    engine.close()
    assert os.path.exists(os.path.join(ckpt, "global_step6", f"exp_avg.{state_dtype}"))
    engine, _, _, _ = zinfinity.initialize(model=mlp(seed=99), config=cfg(3, "nvme", "nvme"))
    engine.load_checkpoint(ckpt)
    resumed = []
    for x, y in data[6:]:
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        resumed.append(loss.item())
    engine.close()
    assert resumed == first[6:]
