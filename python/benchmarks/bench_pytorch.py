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
        if r % 2:
            steps.reverse()
        for _, fn in steps:
            fn()
        line = f"round {r + 1}: CPUAdam {ours_s[-1]:.3f} s, torch AdamW(foreach) {torch_s[-1]:.3f} s"
        if cpp_s:
            line += f", zinfinity-bench adam {cpp_s[-1]:.3f} s"
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
    return 0


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

    def python_pass(path, write):
        start = time.perf_counter()
        for i in range(ops):
            b = bufs[i % len(bufs)]
            if write:
                h.async_pwrite(b, path, i * op)
            else:
                h.async_pread(b, path, i * op)
            if (i + 1) % len(bufs) == 0:
                h.wait()
        h.wait()
        return size / (time.perf_counter() - start) / 1e9

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

    results = {"py_write": [], "py_read": [], "cpp_write": [], "cpp_read": []}
    with tempfile.TemporaryDirectory(prefix="zinf-pybench-", dir=args.path) as d:
        path = os.path.join(d, "data.bin")
        for r in range(args.rounds):
            order = ["py", "cpp"] if r % 2 == 0 else ["cpp", "py"]
            for who in order:
                if who == "py":
                    # Preallocated, as zinfinity-bench io's own file is: the same file state
                    # (extending O_DIRECT writes cost the file system more).
                    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
                    try:
                        os.posix_fallocate(fd, 0, size)
                    finally:
                        os.close(fd)
                    results["py_write"].append(python_pass(path, True))
                    results["py_read"].append(python_pass(path, False))
                    os.remove(path)
                else:
                    w, rd = cpp_pass(d)
                    results["cpp_write"].append(w)
                    results["cpp_read"].append(rd)
            print(f"round {r + 1}: AsyncIOHandle write {results['py_write'][-1]:.2f} read "
                  f"{results['py_read'][-1]:.2f} GB/s; zinfinity-bench io write "
                  f"{results['cpp_write'][-1]:.2f} read {results['cpp_read'][-1]:.2f} GB/s",
                  flush=True)
    for op_name in ("write", "read"):
        py, cpp = median(results[f"py_{op_name}"]), median(results[f"cpp_{op_name}"])
        ratios = [a / b for a, b in zip(results[f"py_{op_name}"], results[f"cpp_{op_name}"])]
        print(f"{op_name}: AsyncIOHandle {py:.2f} GB/s, zinfinity-bench io {cpp:.2f} GB/s, "
              f"ratio of medians {py / cpp:.3f}; per-round ratios median {median(ratios):.3f}, "
              f"{min(ratios):.3f}-{max(ratios):.3f} (target >= 0.9)")
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
    i.add_argument("--bench", required=True, help="zinfinity-bench")
    args = parser.parse_args(argv)
    return bench_adam(args) if args.command == "adam" else bench_io(args)


if __name__ == "__main__":
    sys.exit(main())
