#!/usr/bin/python3
"""A GPT written in plain torch, trained by zinfinity with its parameters and optimizer states on
NVMe: the model is built under ``zinfinity.zero.Init`` (each module's weights go to a file as it
is constructed, so the whole model never sits in memory), then ``zinfinity.initialize`` places
them in the engine's tiers (ZeRO stage 3, ``offload_param`` and ``offload_optimizer`` on NVMe)
and trains it on byte-level text (Debian's fortunes). The parameter bytes exceed the host budget
(``device.host_memory_budget``) several times over.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_gpt_nvme.py --nvme-path /tmp/swap
    ... --compare      # also the same model trained in memory (stage 0), alternated, same run
    ... --overlap-step # the optimizer step beside the window's last backward (swap.overlap_step)

Prints each step's time, the front end's own share (hooks, copies), the engine's I/O and fetch
counts per step, and the peak RSS.
"""

import argparse
import math
import os
import resource
import sys
import time

import torch
from torch import nn

import zinfinity


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(nn.functional.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq_len, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        # GPT-2's initialisation of the embeddings. Under zero.Init the submodules' weights are
        # already written out: GatheredParameters brings them back to modify (a no-op otherwise).
        with zinfinity.zero.GatheredParameters([self.wte.weight, self.wpe.weight], modifier_rank=0):
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # the LM head tied to the embedding


def text_batches(path, rows, seq_len, count, seed=0):
    files = [os.path.join(path, f) for f in sorted(os.listdir(path))] if os.path.isdir(path) \
        else [path]
    data = b"".join(open(f, "rb").read() for f in files if os.path.isfile(f))
    if len(data) < seq_len + 2:
        raise ValueError(f"{path}: too little text")
    corpus = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        starts = torch.randint(0, len(corpus) - seq_len - 1, (rows,), generator=g)
        chunk = torch.stack([corpus[s:s + seq_len + 1] for s in starts.tolist()])
        yield chunk[:, :-1], chunk[:, 1:]


def config(args, offload):
    zero = {"stage": 3 if offload else 0}
    if offload:
        zero.update({
            "stage3_param_persistence_threshold": 0,
            "sub_group_size": 1 << 20,
            # The host tier: 4 buffers of the largest parameter (the MLP's 4 d x d weights).
            "offload_param": {"device": "nvme", "nvme_path": args.nvme_path, "buffer_count": 4,
                              "buffer_size": 4 * args.d_model * args.d_model, "pin_memory": True},
            "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme_path,
                                  "pin_memory": True},
        })
    return {
        "train_micro_batch_size_per_gpu": args.rows,
        "gradient_accumulation_steps": args.micro_steps,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
        "gradient_clipping": args.clipping,
        "zero_optimization": zero,
        "aio": {"block_size": 1048576, "queue_depth": 32},
        "device": {"type": "cpu", "memory_budget": args.device_budget_mib << 20,
                   "host_memory_budget": args.host_budget_mib << 20} if offload else
                  {"type": "cpu", "memory_budget": 64 << 30},
        "steps_per_print": 1000,
        **({"swap": {"overlap_step": True}} if offload and args.overlap_step else {}),
    }


def run(args, offload):
    cfg = config(args, offload)
    torch.manual_seed(1234)
    if offload:
        with zinfinity.zero.Init(config=cfg):
            model = GPT(args.layers, args.d_model, args.heads, args.seq_len)
    else:
        model = GPT(args.layers, args.d_model, args.heads, args.seq_len)
    numel = sum(math.prod(getattr(p, "ds_shape", p.shape)) for p in model.parameters())
    engine, _, _, _ = zinfinity.initialize(model=model, config=cfg)
    label = "nvme" if offload else "memory"
    print(f"[{label}] {numel / 1e6:.1f} M parameters, {4 * numel / 2**20:.0f} MiB fp32"
          + (f" = {4 * numel / (args.host_budget_mib << 20):.1f}x the host budget "
             f"({args.host_budget_mib} MiB)" if offload else ""), flush=True)
    batches = text_batches(args.data, args.rows, args.seq_len, args.steps * args.micro_steps)
    times = []
    for step in range(args.steps):
        before = engine.figures()
        t0 = time.perf_counter()
        for _ in range(args.micro_steps):
            x, y = next(batches)
            loss = nn.functional.cross_entropy(engine(x).reshape(-1, 256), y.reshape(-1))
            engine.backward(loss)
            engine.step()
        took = time.perf_counter() - t0
        times.append(took)
        after = engine.figures()
        reads = (after["fetch_count"] - before["fetch_count"]) / len(engine._zero.params)
        d = {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float))}
        print(f"[{label}] step {step + 1}: loss {loss.item():.4f}  {took:.2f} s  (forward "
              f"{d['forward_seconds']:.2f}, backward {d['backward_seconds']:.2f}, optimizer "
              f"{d['optimizer_seconds']:.2f}, waiting for I/O {d['stall_seconds']:.2f}, front end "
              f"{d['front_end_seconds']:.2f})  read {d['bytes_read'] / 2**20:.0f} MiB  written "
              f"{d['bytes_written'] / 2**20:.0f} MiB  fetches per parameter {reads:.2f}",
              flush=True)
    if "overlap_step" in after:
        o = after["overlap_step"]
        print(f"[{label}] steps beside backward: {o['committed']} committed, {o['redone']} redone "
              f"for clipping, {o['skipped']} skipped, {o['not_speculated']} stepped after backward "
              f"(after a clipped step), {o['recorded']} recording the order", flush=True)
    engine.close()
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nvme-path", default="/tmp/zinfinity-swap")
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--micro-steps", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--host-budget-mib", type=int, default=64)
    p.add_argument("--device-budget-mib", type=int, default=256)
    p.add_argument("--clipping", type=float, default=1.0, help="gradient_clipping (0: none)")
    p.add_argument("--overlap-step", action="store_true",
                   help="swap.overlap_step: step each sub-group beside the window's last backward "
                        "as its gradients become final (bitwise the sequential step)")
    p.add_argument("--compare", type=int, default=0, metavar="PAIRS",
                   help="also train it in memory (stage 0): PAIRS alternated pairs, median ratio")
    args = p.parse_args()
    os.makedirs(args.nvme_path, exist_ok=True)
    if args.compare:
        ratios = []
        for _ in range(args.compare):
            nvme = sorted(run(args, True)[1:])
            memory = sorted(run(args, False)[1:])
            ratios.append(nvme[len(nvme) // 2] / memory[len(memory) // 2])
        ratios.sort()
        print(f"nvme / memory step time (median step after the first, {args.compare} "
              f"alternated pairs): {ratios} median {ratios[len(ratios) // 2]:.3f}")
    else:
        run(args, True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB (device budget {args.device_budget_mib} + host budget "
          f"{args.host_budget_mib} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
