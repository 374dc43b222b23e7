"""zinfinity.optim against torch.optim and against the C++ kernel."""

import os
import subprocess

import pytest
import torch

import zinfinity
from zinfinity.optim import CPUAdagrad, CPUAdam, CPULion

SHAPES = [(1000,), (33, 17), (7,), (4, 5, 6), (70001,)]  # odd sizes: every SIMD tail


def make_params(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_(True) for s in SHAPES]


def clone(params):
    return [p.detach().clone().requires_grad_(True) for p in params]


def run_lockstep(ours, theirs, a, b, steps, seed=7, grad_dtype=None):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p, q in zip(a, b):
            grad = torch.randn(p.shape, generator=g)
            if grad_dtype is not None:
                grad = grad.to(grad_dtype)
            p.grad = grad.to(p.dtype)
            q.grad = grad.to(q.dtype)
        ours.step()
        theirs.step()


def assert_close(actual, expected):
    # 1e-6 relative per element; elements that cross zero have no relative scale, so an
    # absolute floor of 1e-7 (the largest absolute difference measured there is 7e-9).
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_cpuadam_matches_torch_adamw_after_100_steps(amsgrad):
    a = make_params(1)
    b = clone(a)
    init = clone(a)
    ours = CPUAdam(a, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=amsgrad)
    theirs = torch.optim.AdamW(b, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                               amsgrad=amsgrad)
    run_lockstep(ours, theirs, a, b, 100)
    for p, q, p0 in zip(a, b, init):
        assert (p - p0).abs().max() > 1e-2  # 100 steps of lr 1e-3 moved every tensor
        assert_close(p, q)
        s, t = ours.state[p], theirs.state[q]
        assert float(s["step"]) == float(t["step"]) == 100.0
        # The moments round differently (fused multiply-adds): a few ulps over 100 steps.
        torch.testing.assert_close(s["exp_avg_sq"], t["exp_avg_sq"], rtol=2e-6, atol=1e-9)
        if amsgrad:
            torch.testing.assert_close(s["max_exp_avg_sq"], t["max_exp_avg_sq"], rtol=2e-6, atol=1e-9)


def test_cpuadam_adam_mode_matches_torch_adam():
    a = make_params(2)
    b = clone(a)
    ours = CPUAdam(a, lr=2e-3, weight_decay=0.1, adamw_mode=False)
    theirs = torch.optim.Adam(b, lr=2e-3, weight_decay=0.1)
    run_lockstep(ours, theirs, a, b, 100)
    for p, q in zip(a, b):
        assert_close(p, q)


def test_cpuadam_maximize_matches_torch():
    a = make_params(3)
    b = clone(a)
    ours = CPUAdam(a, lr=1e-3, weight_decay=0.01, maximize=True)
    theirs = torch.optim.AdamW(b, lr=1e-3, weight_decay=0.01, maximize=True)
    run_lockstep(ours, theirs, a, b, 20)
    for p, q in zip(a, b):
        assert_close(p, q)


def test_cpuadam_is_the_cpp_kernel_bitwise(workdir):
    exe = os.environ.get("ZINF_KERNEL_REFERENCE")
    assert exe and os.path.exists(exe), "ZINF_KERNEL_REFERENCE: the build's zinf_kernel_reference"
    n, steps = 10007, 100
    g = torch.Generator().manual_seed(11)
    init = torch.randn(n, generator=g)
    grads = torch.randn(steps, n, generator=g)
    src = os.path.join(workdir, "in.bin")
    dst = os.path.join(workdir, "out.bin")
    torch.cat([init, grads.reshape(-1)]).numpy().tofile(src)
    hyper = ["adamw", str(steps), "0.001", "0.9", "0.999", "1e-08", "0.01"]
    subprocess.run([exe, *hyper, src, dst], check=True)
    import numpy as np

    ref = torch.from_numpy(np.fromfile(dst, dtype=np.float32)).reshape(3, n)
    p = init.clone().requires_grad_(True)
    opt = CPUAdam([p], lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for s in range(steps):
        p.grad = grads[s].clone()
        opt.step()
    assert torch.equal(p.detach(), ref[0])
    assert torch.equal(opt.state[p]["exp_avg"], ref[1])
    assert torch.equal(opt.state[p]["exp_avg_sq"], ref[2])
    assert not torch.equal(ref[0], init)


def test_cpuadam_state_dict_round_trip_and_torch_layout():
    a = make_params(4)
    ours = CPUAdam(a, lr=1e-3, weight_decay=0.01)
    b = clone(a)
    theirs = torch.optim.AdamW(b, lr=1e-3, weight_decay=0.01)
    run_lockstep(ours, theirs, a, b, 10)
    sd = ours.state_dict()
    td = theirs.state_dict()
    assert sd["state"].keys() == td["state"].keys()
    for k in td["state"]:
        assert set(sd["state"][k]) == set(td["state"][k])
    for key in td["param_groups"][0]:
        assert key in sd["param_groups"][0], key

    # Our state_dict into a fresh CPUAdam: bitwise the same continuation.
    c = [p.detach().clone().requires_grad_(True) for p in a]
    again = CPUAdam(c, lr=5.0)
    again.load_state_dict(sd)
    assert again.param_groups[0]["lr"] == 1e-3
    # torch's state_dict into CPUAdam and ours into torch's AdamW: same layout.
    d = [p.detach().clone().requires_grad_(True) for p in a]
    from_torch = CPUAdam(d)
    from_torch.load_state_dict(td)
    e = [p.detach().clone().requires_grad_(True) for p in a]
    to_torch = torch.optim.AdamW(e)
    to_torch.load_state_dict(sd)
    g = torch.Generator().manual_seed(99)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=g) for p in a]
        for params in (a, c, d, e):
            for p, gr in zip(params, grads):
                p.grad = gr.clone()
        for opt in (ours, again, from_torch, to_torch):
            opt.step()
    for p, q, r, s in zip(a, c, d, e):
        assert torch.equal(p, q)
        assert_close(r, p)
        assert_close(s, p)


def test_cpuadam_bf16_params_keep_an_fp32_master():
    a = make_params(5, torch.bfloat16)
    ref = [p.detach().float().requires_grad_(True) for p in a]
    ours = CPUAdam(a, lr=1e-3, weight_decay=0.01)
    theirs = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(6)
    for _ in range(30):
        for p, q in zip(a, ref):
            grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)
            p.grad = grad
            q.grad = grad.float()
        ours.step()
        theirs.step()
    for p, q in zip(a, ref):
        master = ours.state[p]["master"]
        assert master.dtype == torch.float32
        assert_close(master, q)
        assert torch.equal(p.detach(), master.to(torch.bfloat16))


def test_cpuadagrad_matches_torch_adagrad():
    a = make_params(7)
    b = clone(a)
    kw = dict(lr=0.05, lr_decay=0.01, weight_decay=0.02, initial_accumulator_value=0.1, eps=1e-10)
    ours = CPUAdagrad(a, **kw)
    theirs = torch.optim.Adagrad(b, **kw)
    run_lockstep(ours, theirs, a, b, 100)
    for p, q in zip(a, b):
        assert_close(p, q)
        torch.testing.assert_close(ours.state[p]["sum"], theirs.state[q]["sum"], rtol=1e-6, atol=0)


def lion_reference(params, grads_per_step, lr, betas, wd):
    """Lion in fp32 torch operations (Chen et al. 2023, Algorithm 2; the order of lion-pytorch)."""
    p = [x.detach().clone() for x in params]
    m = [torch.zeros_like(x) for x in p]
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            p[i].mul_(1 - lr * wd)
            update = m[i].clone().mul_(betas[0]).add(g, alpha=1 - betas[0]).sign_()
            p[i].add_(update, alpha=-lr)
            m[i].mul_(betas[1]).add_(g, alpha=1 - betas[1])
    return p


def test_cpulion_matches_the_algorithm():
    a = make_params(8)
    init = [p.detach().clone() for p in a]
    ours = CPULion(a, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(9)
    steps = [[torch.randn(p.shape, generator=g) for p in a] for _ in range(50)]
    for grads in steps:
        for p, gr in zip(a, grads):
            p.grad = gr.clone()
        ours.step()
    ref = lion_reference(init, steps, 1e-4, (0.9, 0.99), 0.1)
    for p, r, p0 in zip(a, ref, init):
        assert (p.detach() - p0).abs().max() > 1e-3
        assert_close(p.detach(), r)


def test_parameters_without_gradients_are_left_alone():
    a = make_params(10)
    before = [p.detach().clone() for p in a]
    opt = CPUAdam(a)
    a[0].grad = torch.ones_like(a[0])
    opt.step()
    assert not torch.equal(a[0], before[0])
    for p, q in zip(a[1:], before[1:]):
        assert torch.equal(p, q)
        assert p not in opt.state


def test_bad_input_is_refused_with_a_clear_error():
    p = torch.randn(10, requires_grad=True)
    with pytest.raises(ValueError, match="learning rate"):
        CPUAdam([p], lr=-1.0)
    with pytest.raises(ValueError, match="beta1"):
        CPUAdam([p], betas=(1.0, 0.999))
    q = torch.randn(10, 4)[:, 0].clone().requires_grad_(True)
    r = torch.randn(4, 10).t().requires_grad_(True)  # not contiguous
    opt = CPUAdam([q, r])
    q.grad = torch.ones_like(q)
    r.grad = torch.ones_like(r)
    with pytest.raises(ValueError, match="parameter 1 of group 0: not contiguous"):
        opt.step()
    d = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    d.grad = torch.ones_like(d)
    with pytest.raises(ValueError, match="float64"):
        CPUAdam([d]).step()


def test_kernel_threads_can_be_set():
    zinfinity.set_num_threads(1)
    try:
        assert zinfinity.kernel_info()["threads"] == 1
        a = make_params(12)
        b = clone(a)
        run_lockstep(CPUAdam(a), torch.optim.AdamW(b, weight_decay=0.0), a, b, 3)
        for p, q in zip(a, b):
            assert_close(p, q)
    finally:
        zinfinity.set_num_threads(0)
    assert zinfinity.kernel_info()["isa"] in ("avx512", "avx2", "scalar")


@pytest.mark.parametrize("adamw_mode,amsgrad", [(True, False), (False, False), (True, True)])
def test_torch_rounding_is_torch_bit_for_bit(adamw_mode, amsgrad):
    if zinfinity.kernel_info()["isa"] == "scalar":
        pytest.skip("torch fuses its multiply-adds on AVX2 / AVX-512 only; this CPU has neither")
    a = make_params(13)
    b = clone(a)
    ours = CPUAdam(a, lr=1e-3, weight_decay=0.01, adamw_mode=adamw_mode, amsgrad=amsgrad,
                   torch_rounding=True)
    theirs = (torch.optim.AdamW if adamw_mode else torch.optim.Adam)(
        b, lr=1e-3, weight_decay=0.01, amsgrad=amsgrad)
    run_lockstep(ours, theirs, a, b, 100)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        assert torch.equal(ours.state[p]["exp_avg_sq"], theirs.state[q]["exp_avg_sq"])
    with pytest.raises(ValueError, match="torch_rounding: only Adam and AdamW"):
        p = torch.zeros(3, requires_grad=True)
        p.grad = torch.ones(3)
        from zinfinity import _C

        _C.optimizer_step(kind="lion", numel=3, params=p.data_ptr(), grads=p.grad.data_ptr(),
                          grad_dtype="float32", moments=[p.grad.data_ptr()],
                          copy=0, copy_dtype="float32", step=1, lr=0.1,
                          beta1=0.9, beta2=0.99, eps=0.0, weight_decay=0.0,
                          bias_correction=False, amsgrad=False, torch_rounding=True)


def test_bf16_state_dict_keeps_fp32_states_across_load():
    a = make_params(14, torch.bfloat16)
    opt = CPUAdam(a, lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(15)

    def step(params, o):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)
        o.step()

    for _ in range(3):
        step(a, opt)
    b = [p.detach().clone().requires_grad_(True) for p in a]
    again = CPUAdam(b)
    again.load_state_dict(opt.state_dict())  # torch would cast the states to bf16
    for p, q in zip(a, b):
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert again.state[q][key].dtype == torch.float32
            assert torch.equal(again.state[q][key], opt.state[p][key])
    g1 = torch.Generator().manual_seed(16)
    for params, o in ((a, opt), (b, again)):
        g1.manual_seed(16)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g1).to(torch.bfloat16)
        o.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)


def test_loading_torch_adam_keeps_adam_mode_and_torch_rounding():
    a = make_params(17)
    b = clone(a)
    theirs = torch.optim.Adam(b, lr=1e-3, weight_decay=0.1)
    run_lockstep(CPUAdam(clone(a)), theirs, clone(a), b, 3)
    ours = CPUAdam(a, adamw_mode=False, torch_rounding=True)
    with torch.no_grad():
        for p, q in zip(a, b):
            p.copy_(q)
    ours.load_state_dict(theirs.state_dict())
    group = ours.param_groups[0]
    assert group["adamw_mode"] is False and group["torch_rounding"] is True
    assert group["weight_decay"] == 0.1
    run_lockstep(ours, theirs, a, b, 5)
    for p, q in zip(a, b):
        assert torch.equal(p, q)  # Adam (L2) in torch's rounding: torch's bits


def test_a_refused_step_does_not_count():
    p = torch.randn(10, requires_grad=True)
    opt = CPUAdam([p], lr=1e-3)
    p.grad = torch.ones(10)
    opt.step()
    opt.param_groups[0]["lr"] = -1.0
    before = p.detach().clone()
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    assert float(opt.state[p]["step"]) == 1.0
    assert torch.equal(p, before)
