#!/usr/bin/python3
"""zinfinity.initialize's exactness on the Fashion-MNIST MLP (examples/pytorch_fashion_mnist.py's
CustomModel, 784-1024-1024-10, 1.86 M parameters), fp32: every stage x placement the config
accepts (ten) against plain torch with torch.optim.AdamW, STEPS steps of batch 128, the engine's
AdamW with optimizer.params.torch_rounding. Prints, per placement, the first step whose loss
differs from torch's (none: bitwise at every step) and the time.

    PYTHONPATH=build/python /usr/bin/python3 python/benchmarks/front_end_exactness.py \\
        --nvme-path /tmp/zinf-exact --steps 300
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import pytorch_fashion_mnist as example  # noqa: E402

import zinfinity  # noqa: E402

PLACEMENTS = [(0, None, None), (1, None, None), (1, "cpu", None), (1, "nvme", None),
              (2, "cpu", None), (2, "nvme", None), (3, None, None), (3, "cpu", None),
              (3, "nvme", "cpu"), (3, "nvme", "nvme")]


def batches(steps):
    torch.manual_seed(1234)
    loader, _ = example.load_data(batch_size=128, seed=1234)
    out = []
    for x, y in loader:
        out.append((x, y))
        if len(out) == steps:
            return out
    return out


def torch_losses(data):
    torch.manual_seed(7)
    model = example.CustomModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def engine_losses(data, stage, opt, param, nvme):
    torch.manual_seed(7)
    model = example.CustomModel()
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if opt:
        zero["offload_optimizer"] = {"device": opt, "nvme_path": nvme}
    if param:
        zero["offload_param"] = {"device": param, "nvme_path": nvme}
    config = {"train_micro_batch_size_per_gpu": 128, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01,
                                                        "torch_rounding": True}}}
    engine, _, _, _ = zinfinity.initialize(model=model, config=config)
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.close()
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nvme-path", default="/tmp/zinf-exact")
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    os.makedirs(args.nvme_path, exist_ok=True)
    data = batches(args.steps)
    t0 = time.perf_counter()
    want = torch_losses(data)
    print(f"torch.optim.AdamW: {len(want)} steps, loss {want[0]:.4f} -> {want[-1]:.4f}, "
          f"{time.perf_counter() - t0:.1f} s")
    failures = 0
    for stage, opt, param in PLACEMENTS:
        t0 = time.perf_counter()
        got = engine_losses(data, stage, opt, param, args.nvme_path)
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        failures += first is not None
        print(f"stage {stage} offload_optimizer {opt or 'none':4} offload_param {param or 'none':4}: "
              f"{'bitwise equal at every step' if first is None else f'differs from step {first}'}"
              f", {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
