#!/usr/bin/python3
"""The Python package's speed against its baselines, measured in one run on this machine.

    PYTHONPATH=build/python /usr/bin/python3 python/benchmarks/bench_pytorch.py adam \\
        --bench build/tools/zinfinity-bench
    PYTHONPATH=build/python /usr/bin/python3 python/benchmarks/bench_pytorch.py io --path /mnt/nvme \\
        --bench build/tools/zinfinity-bench

adam: ``zinfinity.optim.CPUAdam.step()`` over --params fp32 parameters (one tensor, fp32
gradients, AdamW) against ``torch.optim.AdamW(foreach=True).step()`` on the same data, and against
``zinfinity-bench adam`` (the C++ kernel alone, same parameters and threads: the median of its
3 pairs), in --rounds alternated rounds; each round times the median of --steps consecutive
steps of each optimizer. Prints the medians and the two ratios: CPUAdam over torch (the target is
>= 5) and CPUAdam over the C++ bench (>= 0.9).

io: ``zinfinity.io.AsyncIOHandle`` writes then reads a --size file at --block-size and
--queue-depth, in --op-size operations started --inflight at a time before each ``wait()``,
against ``zinfinity-bench io`` with the same block size, queue depth, threads and operation size
(registered buffers off, as the handle's tensors are not registered; its --json figures),
alternated over --rounds rounds. Prints GB/s medians
and the ratio (target >= 0.9).

--deepspeed (both): the same work also through ``zinfinity.compat.deepspeed``
(``DeepSpeedCPUAdam.step()``; ``aio_handle.async_pwrite``/``async_pread`` on locked tensors) and
a second instance of zinfinity's own, alternated in the same rounds: prints DeepSpeed-style over
own (target within 3 %, or within own-vs-own where that spread is larger). io also times plain
tensors one byte off their alignment, which go through a bounce, and prints its cost per GB.
(io's --bench may then be omitted.)
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import zinfinity
from zinfinity.compat import deepspeed as ds
from zinfinity.io import AsyncIOHandle
from zinfinity.optim import CPUAdam


def parse_count(text):
    """256M = 256e6, 64Mi = 64 * 2**20, 1GiB = 2**30, plain integers."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B?)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    value, unit = float(m.group(1)), (m.group(2) or "").rstrip("B")
    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[unit]
    return int(value * scale)


def median(xs):
    return statistics.median(xs)


def bench_adam(args):
    n = args.params
    threads = args.threads
    zinfinity.set_num_threads(threads)
    torch.set_num_threads(args.torch_threads or threads)
    info = zinfinity.kernel_info()
    print(f"adam: {n} fp32 parameters, AdamW; zinfinity {info['isa']} x {info['threads']} threads, "
          f"torch {torch.__version__} x {torch.get_num_threads()} threads "
          f"(torch_rounding={args.torch_rounding})", flush=True)
    g = torch.Generator().manual_seed(0)
    p = torch.randn(n, generator=g).requires_grad_(True)
    p.grad = torch.randn(n, generator=g)
    q = p.detach().clone().requires_grad_(True)
    q.grad = p.grad.clone()
    ours = CPUAdam([p], lr=1e-3, weight_decay=0.01, torch_rounding=args.torch_rounding)
    theirs = torch.optim.AdamW([q], lr=1e-3, weight_decay=0.01, foreach=True)
    ours.step()  # first touch of the states
    theirs.step()
    extra = {}
    if args.deepspeed:
        for name in ("own 2", "DeepSpeed-style"):
            x = p.detach().clone().requires_grad_(True)
            x.grad = p.grad.clone()
            opt = (CPUAdam([x], lr=1e-3, weight_decay=0.01, torch_rounding=args.torch_rounding)
                   if name == "own 2" else
                   ds.DeepSpeedCPUAdam([x], lr=1e-3, weight_decay=0.01))
            opt.step()
            extra[name] = (x, opt, [])

    def timed(fn):
        # The median of --steps consecutive steps: the first step after a pause runs on cold
        # cores (measured here: CPUAdam up to 2.5x slower after a 3 s sleep).
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return median(times)

    def cpp_bench():
        cmd = [args.bench, "adam", "--params", str(n), "--threads", str(threads), "--pairs",
               "3", "--no-scalar"]
        if args.torch_rounding:
            cmd.append("--torch-rounding")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        m = re.search(r"median kernel:\s+([\d.]+) GB/s = ([\d.e+]+) params/s", out)
        if not m:
            raise RuntimeError(f"unexpected zinfinity-bench adam output:\n{out}")
        return n / float(m.group(2))  # seconds per step

    ours_s, torch_s, cpp_s = [], [], []
    for r in range(args.rounds):
        steps = [("ours", lambda: ours_s.append(timed(ours.step))),
                 ("torch", lambda: torch_s.append(timed(theirs.step)))]
        if args.bench:
            steps.append(("c++", lambda: cpp_s.append(cpp_bench())))
        for name, (_, opt, times) in extra.items():
            steps.append((name, lambda opt=opt, times=times: times.append(timed(opt.step))))
        steps = steps[r % len(steps):] + steps[:r % len(steps)]
        if r % 2:
            steps.reverse()
        for _, fn in steps:
            fn()
        line = f"round {r + 1}: CPUAdam {ours_s[-1]:.3f} s, torch AdamW(foreach) {torch_s[-1]:.3f} s"
        if cpp_s:
            line += f", zinfinity-bench adam {cpp_s[-1]:.3f} s"
        for name, (_, _, times) in extra.items():
            line += f", {name} {times[-1]:.3f} s"
        print(line, flush=True)
    bytes_per_step = 28 * n  # 3 fp32 streams read and written, fp32 grads read
    mo, mt = median(ours_s), median(torch_s)
    print(f"median CPUAdam.step: {mo:.3f} s ({bytes_per_step / mo / 1e9:.1f} GB/s)")
    print(f"median torch.optim.AdamW(foreach=True).step: {mt:.3f} s")
    print(f"ratio CPUAdam / torch: {mt / mo:.2f}x faster (target >= 5)")
    if cpp_s:
        mc = median(cpp_s)
        print(f"median zinfinity-bench adam step: {mc:.3f} s")
        print(f"ratio CPUAdam / C++ kernel: {mc / mo:.3f} (target >= 0.9)")
    if extra:
        report_same_work("DeepSpeedCPUAdam.step", ours_s, extra["own 2"][2],
                         extra["DeepSpeed-style"][2])
    return 0


def report_same_work(what, own, own2, compat):
    """DeepSpeed-style over own (times: lower is faster), against own-vs-own."""
    mo, mo2, mc = median(own), median(own2), median(compat)
    spread = abs(mo2 / mo - 1)
    ratio = mc / mo
    print(f"{what}: DeepSpeed-style {mc:.4f} s, own {mo:.4f} s, own again {mo2:.4f} s")
    verdict = "met" if ratio - 1 <= max(0.03, spread) else "NOT met"
    print(f"ratio DeepSpeed-style / own: {ratio:.3f} (own-vs-own spread {spread * 100:.1f} %; "
          f"target at most max(3 %, spread) slower: {verdict})")


def bench_io(args):
    size = args.size
    h = AsyncIOHandle(block_size=args.block_size, queue_depth=args.queue_depth,
                      intra_op_parallelism=args.threads, backend=args.backend)
    op = args.op_size or size
    if size % op:
        raise SystemExit(f"--size {size} must be a multiple of --op-size {op}")
    ops = size // op
    bufs = [h.new_cpu_locked_tensor(op, torch.empty(0, dtype=torch.uint8))
            for _ in range(min(args.inflight, ops))]
    for b in bufs:
        b.copy_(torch.randint(0, 256, (op,), dtype=torch.uint8))
    print(f"io: {size / 2**30:.2f} GiB, {h.backend}, block {args.block_size}, queue depth "
          f"{args.queue_depth}, {args.threads} thread(s); operations of {op} bytes, "
          f"{len(bufs)} in flight", flush=True)

    def python_pass(path, write, handle=h, buffers=bufs):
        start = time.perf_counter()
        for i in range(ops):
            b = buffers[i % len(buffers)]
            if write:
                handle.async_pwrite(b, path, i * op)
            else:
                handle.async_pread(b, path, i * op)
            if (i + 1) % len(buffers) == 0:
                handle.wait()
        handle.wait()
        return size / (time.perf_counter() - start) / 1e9

    # --deepspeed: the same passes through a second own handle, the DeepSpeed-style handle (the
    # same settings, locked tensors) and plain tensors one byte off their alignment (bounced).
    passes = {"py": (h, bufs)}
    if args.deepspeed:
        settings = (args.block_size, args.queue_depth, False, True, args.threads)
        h2 = AsyncIOHandle(*settings, backend=args.backend)
        hd = ds.aio_handle(*settings, backend=args.backend)
        hb = ds.aio_handle(*settings, backend=args.backend)
        plain = [torch.empty(op + 1, dtype=torch.uint8)[1:] for _ in bufs]
        for b, src in zip(plain, bufs):
            b.copy_(src)
        passes.update({"own2": (h2, [h2.new_cpu_locked_tensor(op, b) for b in bufs]),
                       "ds": (hd, [hd.new_cpu_locked_tensor(op, b) for b in bufs]),
                       "bounce": (hb, plain)})
        for name in ("own2", "ds"):
            for b, src in zip(passes[name][1], bufs):
                b.copy_(src)

    def cpp_pass(directory):
        js = os.path.join(directory, "bench.json")
        cmd = [args.bench, "io", "--path", directory, "--size", str(size), "--op", "write,read",
               "--loops", "1", "--backend", h.backend, "--block-size", str(args.block_size),
               "--queue-depth", str(args.queue_depth), "--threads", str(args.threads),
               "--op-size", str(op), "--buffer-limit", str(2 * op * (args.queue_depth + 1)),
               "--register-buffers", "off", "--json", js,
               "--progress", "off"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        with open(js) as f:
            data = json.load(f)
        os.remove(js)
        try:
            return data["summary"]["write"]["gb_per_s"], data["summary"]["read"]["gb_per_s"]
        except KeyError:
            raise RuntimeError(f"unexpected zinfinity-bench io JSON: {json.dumps(data)[:500]}") from None

    results = {f"{who}_{kind}": [] for who in list(passes) + ["cpp"]
               for kind in ("write", "read")}
    contenders = list(passes) + (["cpp"] if args.bench else [])
    with tempfile.TemporaryDirectory(prefix="zinf-pybench-", dir=args.path) as d:
        path = os.path.join(d, "data.bin")
        for r in range(args.rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            if r % 2:
                order.reverse()
            for who in order:
                if who in passes:
                    # Preallocated, as zinfinity-bench io's own file is: the same file state
                    # (extending O_DIRECT writes cost the file system more).
                    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
                    try:
                        os.posix_fallocate(fd, 0, size)
                    finally:
                        os.close(fd)
                    handle, buffers = passes[who]
                    results[f"{who}_write"].append(python_pass(path, True, handle, buffers))
                    results[f"{who}_read"].append(python_pass(path, False, handle, buffers))
                    os.remove(path)
                else:
                    w, rd = cpp_pass(d)
                    results["cpp_write"].append(w)
                    results["cpp_read"].append(rd)
            print(f"round {r + 1}: " + "; ".join(
                f"{who} write {results[who + '_write'][-1]:.2f} read "
                f"{results[who + '_read'][-1]:.2f} GB/s" for who in contenders), flush=True)
    for op_name in ("write", "read"):
        py = median(results[f"py_{op_name}"])
        if args.bench:
            cpp = median(results[f"cpp_{op_name}"])
            ratios = [a / b for a, b in zip(results[f"py_{op_name}"], results[f"cpp_{op_name}"])]
            print(f"{op_name}: AsyncIOHandle {py:.2f} GB/s, zinfinity-bench io {cpp:.2f} GB/s, "
                  f"ratio of medians {py / cpp:.3f}; per-round ratios median "
                  f"{median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f} (target >= 0.9)")
        if args.deepspeed:
            seconds = {who: [size / 1e9 / x for x in results[f"{who}_{op_name}"]]
                       for who in ("py", "own2", "ds", "bounce")}
            report_same_work(f"{op_name} of {size / 1e9:.2f} GB", seconds["py"],
                             seconds["own2"], seconds["ds"])
            extra = median(seconds["bounce"]) - median(seconds["ds"])
            print(f"{op_name} bounce path: {median(results['bounce_' + op_name]):.2f} GB/s, "
                  f"{extra / (size / 1e9):.3f} s per GB more than locked tensors")
    if args.deepspeed:
        b = passes["bounce"][0].bounce_stats()
        if b["bounces"] == 0:
            print(f"bounce copies: none ({args.path} asks no O_DIRECT alignment, as tmpfs)")
        else:
            print(f"bounce copies: {b['bounces']} of {b['bytes'] / 1e9:.2f} GB in "
                  f"{b['seconds']:.2f} s = {b['seconds'] / (b['bytes'] / 1e9):.3f} s per GB "
                  f"copied")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("adam", help="CPUAdam against torch.optim.AdamW and the C++ kernel")
    a.add_argument("--params", type=parse_count, default=parse_count("256M"))
    a.add_argument("--threads", type=int, default=2, help="zinfinity's threads (and torch's)")
    a.add_argument("--torch-threads", type=int, default=0, help="torch's, when different")
    a.add_argument("--rounds", type=int, default=5)
    a.add_argument("--steps", type=int, default=3, help="consecutive steps timed per round")
    a.add_argument("--bench", default="", help="zinfinity-bench (omit: no C++ comparison)")
    a.add_argument("--torch-rounding", action="store_true")
    a.add_argument("--deepspeed", action="store_true",
                   help="also DeepSpeedCPUAdam and a second CPUAdam, alternated")
    i = sub.add_parser("io", help="AsyncIOHandle against zinfinity-bench io")
    i.add_argument("--path", required=True, help="directory on the drive to measure")
    i.add_argument("--size", type=parse_count, default=parse_count("1GiB"))
    i.add_argument("--block-size", type=parse_count, default=parse_count("1MiB"))
    i.add_argument("--queue-depth", type=int, default=8)
    i.add_argument("--threads", type=int, default=1)
    i.add_argument("--op-size", type=parse_count, default=0,
                   help="bytes per async_pread / async_pwrite (and zinfinity-bench io --op-size); "
                        "default: --size, one tensor of the whole file")
    i.add_argument("--inflight", type=int, default=1, help="operations started between waits")
    i.add_argument("--backend", default="io_uring")
    i.add_argument("--rounds", type=int, default=5)
    i.add_argument("--bench", default="", help="zinfinity-bench (omit: no C++ comparison)")
    i.add_argument("--deepspeed", action="store_true",
                   help="also the DeepSpeed-style handle, a second own one and the bounce path")
    args = parser.parse_args(argv)
    return bench_adam(args) if args.command == "adam" else bench_io(args)


if __name__ == "__main__":
    sys.exit(main())
