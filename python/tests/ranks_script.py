"""Run by test_engine_ranks.py, once alone and once under mpirun: the same global batches,
split over the ranks (rank r takes rows [r*micro, (r+1)*micro) of each), or accumulated by one
rank in micro-batches of the same rows. Rank 0 writes the losses and final weights.

    ranks_script.py OUT STAGE MICRO GAS [CKPT_DIR [RESUME]]
"""

import json
import os
import sys

import torch
from torch import nn

import zinfinity

out, stage, micro, gas = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ckpt = sys.argv[5] if len(sys.argv) > 5 else None
resume = len(sys.argv) > 6
rank, world = zinfinity._C.launch()
torch.manual_seed(7)
model = nn.Sequential(nn.Linear(32, 40), nn.Tanh(), nn.Linear(40, 6))
nvme = os.path.join(os.path.dirname(out), f"nvme{rank}")
os.makedirs(nvme, exist_ok=True)
zero = {"stage": stage}
if stage >= 1:
    zero["offload_optimizer"] = {"device": "nvme" if stage == 3 else "cpu", "nvme_path": nvme}
if stage == 3:
    zero["offload_param"] = {"device": "nvme", "nvme_path": nvme}
config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "zero_optimization": zero,
          "comm": {"deterministic": True}, "steps_per_print": 1000}
engine, _, _, _ = zinfinity.initialize(model=model, config=config)
assert engine.train_batch_size() == micro * gas * world
g = torch.Generator().manual_seed(11)
rows = micro * gas * world
batches = [(torch.randn(rows, 32, generator=g), torch.randint(0, 6, (rows,), generator=g))
           for _ in range(8)]
first = 0
if resume:
    engine.load_checkpoint(ckpt)
    first = 4
losses = []
for x, y in batches[first:]:
    for k in range(gas):
        part = slice((k * world + rank) * micro, (k * world + rank + 1) * micro)
        loss = nn.functional.cross_entropy(engine(x[part]), y[part])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if ckpt and not resume and engine.global_steps == 4:
        engine.save_checkpoint(ckpt, tag="step4")
weights = {k: v.tolist() for k, v in engine.module.state_dict().items()}
engine.close()
if rank == 0:
    with open(out, "w") as f:
        json.dump({"weights": weights, "losses": losses, "world": world}, f)
