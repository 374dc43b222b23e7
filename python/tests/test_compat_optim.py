"""zinfinity.compat.deepspeed's optimizers and raw ops: DeepSpeed's signatures, state keys,
attributes, return codes and bf16 behaviour, over zinfinity's kernel."""

import inspect

import pytest
import torch

from zinfinity import optim
from zinfinity.compat import deepspeed as ds


def grads(n, steps, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(steps)]


def test_adam_takes_deepspeeds_positional_order_and_defaults():
    names = list(inspect.signature(ds.DeepSpeedCPUAdam).parameters)
    assert names[:9] == ["model_params", "lr", "bias_correction", "betas", "eps",
                         "weight_decay", "amsgrad", "adamw_mode", "fp32_optimizer_states"]
    p = torch.nn.Parameter(torch.zeros(4))
    # Positional as DeepSpeed's engine passes them: bias_correction before betas.
    opt = ds.DeepSpeedCPUAdam([p], 0.01, False, (0.8, 0.9), 1e-6, 0.1, False, False, True)
    group = opt.param_groups[0]
    assert (group["lr"], group["bias_correction"], group["betas"], group["eps"],
            group["weight_decay"], group["amsgrad"]) == (0.01, False, (0.8, 0.9), 1e-6, 0.1,
                                                         False)
    assert "adamw_mode" not in group  # an attribute, as DeepSpeed's
    assert opt.adam_w_mode is False and opt.fp32_optimizer_states is True
    second = ds.DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))])
    assert second.opt_id == opt.opt_id + 1


def test_adam_equals_torch_adamw_and_keeps_deepspeeds_state_keys():
    p = torch.nn.Parameter(torch.randn(1000, generator=torch.Generator().manual_seed(1)))
    ref = torch.nn.Parameter(p.detach().clone())
    opt = ds.DeepSpeedCPUAdam([p], lr=1e-2, weight_decay=0.05)
    torch_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.05)
    for g in grads(1000, 20, 2):
        p.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    torch.testing.assert_close(p.detach(), ref.detach(), rtol=1e-6, atol=1e-6)
    state = opt.state[p]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
    assert state["step"] == 20 and isinstance(state["step"], int)
    torch.testing.assert_close(state["exp_avg_sq"], torch_opt.state[ref]["exp_avg_sq"])


def test_adam_l2_mode_equals_torch_adam():
    p = torch.nn.Parameter(torch.randn(300, generator=torch.Generator().manual_seed(3)))
    ref = torch.nn.Parameter(p.detach().clone())
    opt = ds.DeepSpeedCPUAdam([p], lr=1e-2, weight_decay=0.1, adamw_mode=False)
    torch_opt = torch.optim.Adam([ref], lr=1e-2, weight_decay=0.1)
    for g in grads(300, 10, 4):
        p.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    torch.testing.assert_close(p.detach(), ref.detach(), rtol=1e-6, atol=1e-6)


def test_bf16_params_update_in_place_with_fp32_moments_by_default():
    p = torch.nn.Parameter(torch.randn(5000).bfloat16())
    address = p.data_ptr()
    wide = p.detach().float()  # what DeepSpeed steps: the bf16 value widened, every step
    ref_opt = torch.optim.AdamW([torch.nn.Parameter(wide)], lr=1e-3, weight_decay=0)
    ref = ref_opt.param_groups[0]["params"][0]
    opt = ds.DeepSpeedCPUAdam([p])
    for g in grads(5000, 5, 5, torch.bfloat16):
        p.grad = g
        ref.grad = g.float()
        opt.step()
        ref_opt.step()
        ref.data.copy_(ref.data.bfloat16().float())  # the parameter is rounded each step
    state = opt.state[p]
    assert p.data_ptr() == address and p.dtype == torch.bfloat16
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert "master" not in state
    assert (p.detach().float() - ref.detach()).abs().max() <= 2 ** -7 * ref.abs().max()


def test_an_fp32_master_only_when_asked():
    p = torch.nn.Parameter(torch.randn(64).bfloat16())
    opt = ds.DeepSpeedCPUAdam([p], fp32_master=True)
    p.grad = torch.randn(64).bfloat16()
    opt.step()
    master = opt.state[p]["master"]
    assert master.dtype == torch.float32
    assert torch.equal(p.detach(), master.bfloat16())


def bf16_reference_step(p, m, v, g, step, lr, b1, b2, eps, wd):
    """One AdamW step in float64 from bf16 values, rounded to bf16 (to nearest even). Returns
    the rounded (p, m, v) and, for each, the magnitude of the terms summed to make it."""
    p, m, v, g = (t.double() for t in (p, m, v, g))
    m_scale = (b1 * m).abs() + ((1 - b1) * g).abs()
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = v.sqrt() / (1 - b2 ** step) ** 0.5 + eps
    update = lr / (1 - b1 ** step) * m / denom
    p_scale = (p * (1 - lr * wd)).abs() + update.abs()
    p = p * (1 - lr * wd) - update
    return (p.bfloat16(), m.bfloat16(), v.bfloat16()), (p_scale, m_scale, v)


def ulps(actual, expected):
    """|actual - expected| in bf16 ulps of expected (bf16 ordered as integers)."""
    def ordered(t):
        bits = t.view(torch.int16).int()
        return torch.where(bits < 0, -32768 - bits, bits)
    return (ordered(actual) - ordered(expected)).abs()


# A sum that cancels to below 2**-20 of its terms has no bf16 ulp any fp32 kernel (DeepSpeed's
# included) can meet: fp32 itself rounds the terms by 2**-24 of their size. Such elements
# (counted and printed) are held to that absolute bound instead.
CANCELLED = 2.0 ** -20


def test_bf16_moments_stay_within_one_ulp_of_a_float64_reference():
    n, lr, betas, eps, wd = 100_003, 1e-3, (0.9, 0.999), 1e-8, 0.01
    p = torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(6)).bfloat16())
    opt = ds.DeepSpeedCPUAdam([p], lr=lr, betas=betas, eps=eps, weight_decay=wd,
                              fp32_optimizer_states=False)
    worst, cancelled = 0, 0
    for step, g in enumerate(grads(n, 10, 7, torch.bfloat16), start=1):
        state = opt.state[p]
        before = (p.detach().clone(), state["exp_avg"].clone() if state else torch.zeros_like(p),
                  state["exp_avg_sq"].clone() if state else torch.zeros_like(p))
        p.grad = g
        opt.step()
        expected, scales = bf16_reference_step(*before, g, step, lr, *betas, eps, wd)
        actual = (p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])
        for a, e, scale in zip(actual, expected, scales):
            assert a.dtype == torch.bfloat16
            exact = e.double().abs() >= CANCELLED * scale
            worst = max(worst, int(ulps(a, e)[exact].max()))
            cancelled += int((~exact).sum())
            assert bool(((a.double() - e.double()).abs() <= CANCELLED * scale)[~exact].all())
    assert worst <= 1
    state = opt.state[p]
    per_param = (p.element_size() + p.grad.element_size() + state["exp_avg"].element_size()
                 + state["exp_avg_sq"].element_size())
    print(f"\nbf16 params, bf16 moments: {per_param} bytes per parameter (param, grad, 2 "
          f"moments; with fp32 moments {per_param + 4}); worst step error {worst} ulp over "
          f"{10 * 3 * n} values; {cancelled} cancelled sums within 2**-20 of their terms")
    assert per_param == 8


def test_a_parameter_off_the_cpu_fails_deepspeeds_assertion():
    p = torch.nn.Parameter(torch.zeros(4, device="meta"))
    p.grad = torch.zeros(4, device="meta")
    for opt in (ds.DeepSpeedCPUAdam([p]), ds.DeepSpeedCPUAdagrad([p]), ds.DeepSpeedCPULion([p])):
        with pytest.raises(AssertionError, match="param is on meta and must be 'cpu'"):
            opt.step()


def test_amsgrad_is_refused_not_ignored():
    with pytest.raises(ValueError, match="amsgrad"):
        ds.DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))], amsgrad=True)


def test_rollback_undoes_each_step_with_its_own_gradient():
    p = torch.nn.Parameter(torch.randn(513, generator=torch.Generator().manual_seed(10)))
    for adamw in (True, False):
        opt = ds.DeepSpeedCPUAdam([p], lr=1e-2, weight_decay=0.02, adamw_mode=adamw)
        history = []
        for g in grads(513, 4, 11):
            history.append((p.detach().clone(), g))
            p.grad = g
            opt.step_subgroup(7)
        for before, g in reversed(history):
            p.grad = g
            opt.rollback_subgroup(7)
            # Undoing a step subtracts from fp32 moments that already rounded away part of
            # the older, smaller terms; an element whose moments nearly cancel then moves by a
            # few hundredths of a step (lr). Everything else comes back within 1e-4.
            torch.testing.assert_close(p.detach(), before, rtol=1e-4, atol=0.05 * 1e-2)
            assert float((p.detach() - before).abs().median()) < 1e-6
        assert opt.state[7]["step"] == 0
        assert float(opt.state[7]["exp_avg"].abs().max()) < 1e-6
        with pytest.raises(RuntimeError, match="Cannot rollback sub_group_id 7: step count is 0"):
            opt.rollback_subgroup(7)
    with pytest.raises(RuntimeError, match="sub_group_id 3 as it has not been initialized"):
        opt.rollback_subgroup(3)


def test_rollback_of_bf16_prints_and_changes_nothing_but_the_count(capsys):
    p = torch.nn.Parameter(torch.randn(64).bfloat16())
    opt = ds.DeepSpeedCPUAdam([p])
    p.grad = torch.randn(64).bfloat16()
    opt.step_subgroup(0)
    after = p.detach().clone()
    opt.rollback_subgroup(0)
    assert "only supports float32" in capsys.readouterr().out
    assert torch.equal(p.detach(), after) and opt.state[0]["step"] == 0


def test_raw_adam_op_return_codes_and_errors():
    op = ds.CPUAdamBuilder().load()
    assert op is ds.CPUAdamBuilder().load()  # loaded once, as DeepSpeed's builders
    assert not hasattr(op, "zenflow_adam_ctrl_size")
    assert op.create_adam(9001, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, False) == 0
    p, g = torch.randn(33), torch.randn(33)
    m, v = torch.zeros(33), torch.zeros(33)
    before = p.clone()
    assert op.adam_update(9001, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v) == 0
    assert not torch.equal(p, before)
    assert op.adam_rollback(9001, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v) == 0
    torch.testing.assert_close(p, before, rtol=0, atol=1e-6)
    half = torch.zeros(33, dtype=torch.float16)
    assert op.adam_rollback(9001, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, half, g, m, v) == -1
    with pytest.raises(RuntimeError, match="param type torch.float32 and state type "
                                           "torch.bfloat16 is not supported"):
        op.adam_update(9001, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m.bfloat16(),
                       v.bfloat16())
    with pytest.raises(ValueError, match="grads has 5 elements"):
        op.adam_update(9001, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g[:5], m, v)
    assert op.destroy_adam(9001) == 0
    with pytest.raises(RuntimeError, match="#9001 does not exist"):
        op.adam_update(9001, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v)


def test_raw_op_of_a_strided_tensor_writes_back():
    op = ds.CPUAdamBuilder().load()
    op.create_adam(9002, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, False)
    base = torch.randn(8, 8)
    p = base.t()  # not contiguous
    expected = p.contiguous()
    g, m, v = torch.randn(8, 8), torch.zeros(8, 8), torch.zeros(8, 8)
    op.adam_update(9002, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, expected, g, m.clone(),
                   v.clone())
    op.adam_update(9002, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v)
    assert torch.equal(base.t(), expected)
    op.destroy_adam(9002)


def test_adagrad_takes_deepspeeds_order_and_state_key():
    p = torch.nn.Parameter(torch.randn(500, generator=torch.Generator().manual_seed(12)))
    ref = torch.nn.Parameter(p.detach().clone())
    opt = ds.DeepSpeedCPUAdagrad([p], 0.05, 1e-8)  # (params, lr, eps): eps is not lr_decay
    assert opt.param_groups[0]["eps"] == 1e-8 and "lr_decay" not in opt.param_groups[0]
    torch_opt = torch.optim.Adagrad([ref], lr=0.05, eps=1e-8)
    for g in grads(500, 10, 13):
        p.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    torch.testing.assert_close(p.detach(), ref.detach(), rtol=1e-6, atol=1e-6)
    assert set(opt.state[p]) == {"step", "exp_avg_sq"}
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], torch_opt.state[ref]["sum"])


def test_adagrad_steps_sparse_gradients_as_torch():
    emb = torch.nn.Embedding(64, 16, sparse=True)
    ref = torch.nn.Embedding(64, 16, sparse=True)
    ref.weight.data.copy_(emb.weight.data)
    opt = ds.DeepSpeedCPUAdagrad(emb.parameters(), lr=0.1)
    torch_opt = torch.optim.Adagrad(ref.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(14)
    for _ in range(10):
        ids = torch.randint(0, 64, (20,), generator=gen)  # repeated rows too
        for module, o in ((emb, opt), (ref, torch_opt)):
            o.zero_grad()
            module(ids).pow(2).sum().backward()
            assert module.weight.grad.is_sparse
            o.step()
    torch.testing.assert_close(emb.weight.detach(), ref.weight.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(opt.state[emb.weight]["exp_avg_sq"],
                               torch_opt.state[ref.weight]["sum"], rtol=1e-6, atol=1e-6)


def test_zinfinity_adagrad_loads_deepspeeds_state():
    p = torch.nn.Parameter(torch.randn(100))
    q = torch.nn.Parameter(p.detach().clone())
    ds_opt = ds.DeepSpeedCPUAdagrad([p], lr=0.05)
    ours = optim.CPUAdagrad([q], lr=0.05)
    for g in grads(100, 3, 15):
        p.grad = g.clone()
        ds_opt.step()
    ours.load_state_dict(ds_opt.state_dict())
    assert set(ours.state[q]) == {"step", "sum"}
    q.data.copy_(p.data)
    g = torch.randn(100)
    p.grad, q.grad = g.clone(), g.clone()
    ds_opt.step()
    ours.step()  # torch's state key, no KeyError
    torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-6, atol=1e-7)


def test_lion_has_deepspeeds_defaults_and_state():
    p = torch.nn.Parameter(torch.randn(50))
    opt = ds.DeepSpeedCPULion([p])
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.param_groups[0]["betas"] == (0.9, 0.999)
    start = p.detach().clone()
    p.grad = torch.randn(50)
    opt.step()
    assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"}
    # Lion moves every element by exactly lr (no weight decay) in the gradient's sign's
    # direction at the first step.
    torch.testing.assert_close((start - p.detach()), 1e-3 * p.grad.sign(), rtol=0, atol=2e-7)


def test_state_dict_round_trip_keeps_state_dtypes():
    p = torch.nn.Parameter(torch.randn(40).bfloat16())
    opt = ds.DeepSpeedCPUAdam([p])
    p.grad = torch.randn(40).bfloat16()
    opt.step()
    again = ds.DeepSpeedCPUAdam([p])
    again.load_state_dict(opt.state_dict())  # torch would cast the moments to bf16
    assert again.state[p]["exp_avg"].dtype == torch.float32
    assert torch.equal(again.state[p]["exp_avg"], opt.state[p]["exp_avg"])
