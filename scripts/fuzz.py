#!/usr/bin/env python3
"""Config fuzzer for zinfinity-train: seeded, reproducible cases that must end well.

Each seed draws a config (an MLP or a small GPT; stage 0-3; parameters and optimizer states
nowhere, on the host or on NVMe; fp32, bf16 or fp16; accumulation; sub-group, buffer and aio
sizes; device and host budgets, some too small; 1-3 ranks; sometimes a fault plan for the swap
I/O) and runs zinfinity-train on it for a few steps. The case passes when the run

  * trains its steps, with every loss byte-identical to the same model trained without
    offload (stage 0, no budgets: the reference; stage 2 over several ranks with accumulation,
    see reference_stage), or
  * is refused before its first step with an error that names what is wrong, or
  * (a case with a fault plan) stops with an error that names the injected fault,

and in every outcome: no signal, no hang (a time limit), no sanitizer report, and no file left
in its swap directory. A failing seed prints the one command that reproduces it.

  scripts/fuzz.py --train BUILD/tools/zinfinity-train --seeds 500 [--first 1] [--jobs 2]
  scripts/fuzz.py --train ... --seed 17 --verbose      # one case, its config and output

Exit status: 0 when every case passed, 1 otherwise, 2 for bad arguments.
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

KIB, MIB = 1024, 1024 * 1024
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "ThreadSanitizer")


def draw_model(rng):
    """An MLP (70 %) or a small GPT, with its dataset."""
    if rng.random() < 0.7:
        hidden = [rng.choice([8, 16, 24, 32, 64, 96, 128, 256]) for _ in range(rng.randint(1, 3))]
        layers = [rng.choice([16, 32, 64, 100])] + hidden + [rng.choice([2, 10])]
        model = {"type": "mlp", "layers": layers, "activation": rng.choice(["relu", "gelu"])}
        if rng.random() < 0.3:
            model["layernorm"] = True
        return model, {"dataset": "synthetic"}
    heads = rng.choice([1, 2])
    model = {"type": "gpt", "n_layer": rng.randint(1, 2), "n_head": heads,
             "d_model": heads * rng.choice([8, 16]), "seq_len": rng.choice([8, 16]),
             "dropout": 0.0}
    if rng.random() < 0.3:
        model["checkpoint_activations"] = True
    return model, {"dataset": "text"}


def draw_zero(rng, swap_dir):
    """The zero_optimization block: stage, offload of parameters and optimizer, sizes."""
    stage = rng.randint(0, 3)
    zero = {"stage": stage, "sub_group_size": rng.choice([1000, 4096, 65536, 1 << 20])}
    opt_dev = rng.choice(["none", "cpu", "nvme"]) if stage >= 1 else "none"
    if opt_dev != "none":
        zero["offload_optimizer"] = {"device": opt_dev, "pin_memory": rng.random() < 0.5}
        if opt_dev == "nvme":
            zero["offload_optimizer"].update(
                nvme_path=swap_dir, pipeline_read=rng.random() < 0.5,
                pipeline_write=rng.random() < 0.5,
                stream_gradients=rng.choice([True, False, "auto"]))
    if stage == 3:
        param_dev = rng.choice(["none", "cpu", "nvme"])
        if param_dev != "none":
            zero["offload_param"] = {
                "device": param_dev, "pin_memory": rng.random() < 0.5,
                "buffer_count": rng.randint(1, 8),
                "buffer_size": rng.choice([4 * KIB, 64 * KIB, 256 * KIB, MIB]),
                "max_in_cpu": rng.choice([0, 64 * KIB, MIB, 64 * MIB])}
            if param_dev == "nvme":
                zero["offload_param"]["nvme_path"] = swap_dir
        zero["stage3_prefetch_bucket_size"] = rng.choice([0, 4096, 65536, MIB])
        zero["stage3_max_live_parameters"] = rng.choice([4096, 65536, MIB])
        zero["stage3_param_persistence_threshold"] = rng.choice([0, 100, 10000])
    return zero


def uses_nvme(zero):
    return any(zero.get(k, {}).get("device") == "nvme"
               for k in ("offload_optimizer", "offload_param"))


def draw_case(seed, swap_dir, have_mpi):
    """The config, ranks and fault plan of `seed` (the same for the same seed, always)."""
    rng = random.Random(seed)
    model, data = draw_model(rng)
    ranks = rng.choices([1, 2, 3], weights=[6, 3, 1])[0] if have_mpi else 1
    micro, accum = rng.choice([1, 2, 4, 8]), rng.randint(1, 3)
    steps = 3
    # The end-of-epoch evaluation on a few batches: a stage-3 case gathers every layer per
    # evaluation batch, and the whole validation set (16k windows of the text) takes minutes
    # when the ranks are oversubscribed under load, which the hang timeout would report.
    data.update(epochs=1, max_steps=steps, eval_samples=64)
    if data["dataset"] == "synthetic":
        data["synthetic_samples"] = micro * accum * ranks * (steps + 1)
    kind = rng.choice(["AdamW", "Adam", "Adagrad", "Lion"])
    config = {
        "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
        "steps_per_print": 1, "seed": rng.randint(1, 10000),
        "gradient_clipping": rng.choice([0.0, 1.0]),
        "optimizer": {"type": kind, "params": {"lr": rng.choice([1e-3, 1e-2])}},
        "zero_optimization": draw_zero(rng, swap_dir),
        "model": model, "data": data,
        "device": {"type": "cpu"},
        # Every stage trains the same bits over several ranks with deterministic collectives
        # (src/engine/README.md); without, stages 2-3 reduce in another order than stage 0.
        "comm": {"deterministic": True},
        "aio": {"block_size": rng.choice([4 * KIB, 64 * KIB, MIB]),
                "queue_depth": rng.choice([1, 4, 32, 64]),
                "thread_count": rng.choice([1, 2])},
    }
    dtype = rng.choice(["fp32", "fp32", "bf16", "fp16"])
    if dtype != "fp32":
        config[dtype] = {"enabled": True}
    if rng.random() < 0.6:
        # Now and then one under the key's 1 MiB minimum: the config must refuse it.
        config["device"]["memory_budget"] = rng.choices(
            [512 * KIB, MIB, 2 * MIB, 8 * MIB, 64 * MIB], weights=[1, 5, 5, 5, 5])[0]
    if rng.random() < 0.4:
        config["device"]["host_memory_budget"] = rng.choice([64 * KIB, MIB, 16 * MIB, 256 * MIB])
    fault = None
    if uses_nvme(config["zero_optimization"]) and rng.random() < 0.25:
        fault = rng.choice([f"fail_nth={rng.randint(1, 300)},errno=EIO",
                            f"enospc_after={rng.choice([64, 256, 1024])}KiB",
                            f"read_error=0.02,seed={seed}", f"write_error=0.02,seed={seed}"])
    return config, ranks, fault


def reference_stage(config, ranks):
    """Stage 0, except where the stages' reduction orders differ: over several ranks with
    accumulation, stages 2-3 reduce each micro-step's gradient as it comes and stages 0-1 reduce
    the accumulated sum at the boundary, which rounds differently (a known difference, not yet
    made bitwise); there the reference is stage 2, which reduces as stage 3 does."""
    several = ranks > 1 and config["gradient_accumulation_steps"] > 1
    return 2 if several and config["zero_optimization"]["stage"] >= 2 else 0


def reference_of(config, ranks):
    """The same model, data and optimizer without offload, budgets or aio settings."""
    ref = json.loads(json.dumps(config))
    ref["zero_optimization"] = {"stage": reference_stage(config, ranks)}
    ref["device"] = {"type": "cpu"}
    ref.pop("aio", None)
    return ref


def launcher(ranks):
    if ranks == 1:
        return []
    return [shutil.which("mpirun"), "--oversubscribe", "-np", str(ranks)]


def run_train(args, config, ranks, fault, workdir, name):
    """Runs one training; returns (returncode, stdout, stderr, loss log text, seconds)."""
    cfg_path = os.path.join(workdir, f"{name}.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    loss_log = os.path.join(workdir, f"{name}.losses")
    cmd = launcher(ranks) + [args.train, "--config", cfg_path, "--loss-log", loss_log,
                             "--progress", "off"]
    if fault:
        cmd += ["--io-faults", fault]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    if ranks > 1 and "ASAN_OPTIONS" in env:
        # Open MPI's own allocations cannot be suppressed by module: leak detection is off for
        # MPI processes, as for the MPI tests (cmake/ZinfMpi.cmake); the rest still reports.
        env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1"
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", e.stderr or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
    seconds = time.monotonic() - start
    losses = open(loss_log).read() if os.path.exists(loss_log) else ""
    return rc, out, err, losses, seconds


# The base path's lock file holds no data and stays by design (removing it would race with the
# next run taking the lock; swap/README.md).
LOCK_FILE = "zinfinity-swap.lock"


def leftover_files(path):
    found = []
    for root, _, files in os.walk(path):
        found += [os.path.join(root, f) for f in files if f != LOCK_FILE]
    return found


def describe(config, ranks, fault):
    z = config["zero_optimization"]
    dtype = "bf16" if "bf16" in config else "fp16" if "fp16" in config else "fp32"
    parts = [config["model"]["type"], f"stage {z['stage']}",
             f"param {z.get('offload_param', {}).get('device', 'none')}",
             f"opt {z.get('offload_optimizer', {}).get('device', 'none')}",
             config["optimizer"]["type"], dtype, f"{ranks} rank{'s' if ranks > 1 else ''}"]
    if fault:
        parts.append(f"faults {fault}")
    return ", ".join(parts)


def check_case(args, seed):
    """Runs seed's case and its reference; returns (passed, one-line outcome, details)."""
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix=f"zinf-fuzz-{seed}-", dir=args.dir)
    swap = os.path.join(root, "swap")
    os.mkdir(swap)
    config, ranks, fault = draw_case(seed, swap, shutil.which("mpirun") is not None)
    what = describe(config, ranks, fault)
    try:
        rc, out, err, losses, secs = run_train(args, config, ranks, fault, root, "case")
        details = f"--- config\n{json.dumps(config, indent=1)}\n--- stdout\n{out}\n--- stderr\n{err}"
        # The program's own error line (under mpirun, the launcher's lines follow it).
        named = [l for l in err.splitlines() if l.startswith("zinfinity-train:")]
        last = named[0] if named else (err.strip().splitlines() or [""])[-1]
        bad = None
        if rc is None:
            bad = f"hang: no exit within {args.timeout} s"
        elif rc < 0 or rc >= 128:
            bad = f"signal or abort: exit status {rc}"
        elif any(m in err for m in SANITIZER_MARKS):
            bad = "sanitizer report"
        left = leftover_files(swap)
        if bad is None and left:
            bad = f"{len(left)} file(s) left in the swap directory, e.g. {left[0]}"
        if bad is not None:
            return False, f"FAIL {bad} [{what}]", details
        if rc != 0:
            if not last.startswith("zinfinity-train:"):
                return False, f"FAIL error without a named cause: {last!r} [{what}]", details
            if fault and "injected" in last:
                return True, f"stopped by the injected fault [{what}]", details
            if "step 1:" in out or losses:
                return False, f"FAIL failed after training started: {last} [{what}]", details
            return True, f"refused: {last[len('zinfinity-train: '):][:150]} [{what}]", details
        ref_rc, _, ref_err, ref_losses, _ = run_train(args, reference_of(config, ranks), ranks, None,
                                                      root, "reference")
        if ref_rc != 0:
            return False, f"FAIL the reference failed: {ref_err.strip()[-200:]} [{what}]", details
        if losses != ref_losses:
            return False, f"FAIL losses differ from the reference [{what}]", \
                details + f"\n--- losses\n{losses}\n--- reference\n{ref_losses}"
        return True, f"trained {len(losses.splitlines())} micro-steps, losses equal the " \
                     f"reference's ({secs:.1f} s) [{what}]", details
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="the zinfinity-train binary")
    ap.add_argument("--seeds", type=int, default=30, help="how many seeds (default 30)")
    ap.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--seed", type=int, help="run only this seed")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds before a hang (300)")
    ap.add_argument("--dir", default=None, help="where the cases' swap directories go")
    ap.add_argument("--verbose", action="store_true", help="print each case's config and output")
    args = ap.parse_args()
    if not os.access(args.train, os.X_OK):
        print(f"fuzz: --train {args.train}: not an executable", file=sys.stderr)
        return 2
    args.train = os.path.abspath(args.train)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    start, failed, counts = time.monotonic(), [], {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for seed, (ok, line, details) in zip(seeds, pool.map(lambda s: check_case(args, s), seeds)):
            print(f"seed {seed}: {line}", flush=True)
            kind = line.split(" ")[0] if ok else "FAIL"
            counts[kind] = counts.get(kind, 0) + 1
            if args.verbose or not ok:
                print(details if args.verbose else details[:4000])
            if not ok:
                failed.append(seed)
                print(f"  reproduce: {sys.executable} {os.path.abspath(__file__)} "
                      f"--train {args.train} --seed {seed} --verbose")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"fuzz: {len(seeds)} seeds in {time.monotonic() - start:.0f} s: {summary}")
    if failed:
        print(f"fuzz: failing seeds: {' '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
