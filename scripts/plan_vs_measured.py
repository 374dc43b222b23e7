#!/usr/bin/python3
"""The planner's predicted step time against the measured one, on every shipped config.

  /usr/bin/python3 scripts/plan_vs_measured.py --profile FILE [--build DIR] [--rounds N]

For each config in configs/: zinfinity-plan --profile FILE --json gives the predicted step time
(and its compute / I/O split); zinfinity-train runs the config twice, for N1 and N2 optimizer
steps, and the steady step time is the difference of the two runs' training times over N2 - N1
steps (set-up, the first step's trace recording and the final evaluation cancel out). Rounds
alternate the configs; the table gives each config's median measured step, the prediction and
their ratio, then the median of the absolute errors. Swap files go under --swap (removed after).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

# Steps of the short and the long run, per config: enough for the difference to dominate noise.
STEPS = {
    "fashion-mnist": (20, 120),
    "fashion-mnist-cpu": (20, 120),
    "fashion-mnist-nvme": (20, 120),
    "gpt-small": (5, 25),
    "big-mlp-nvme": (2, 6),
    "gpt-nvme": (1, 3),
}
# Runs longer than the config's data allows: more epochs, no evaluation.
EXTRA = {
    "big-mlp-nvme": ["data.epochs=2"],
    "gpt-nvme": [],
}

SUMMARY = re.compile(r"^summary: (\d+) steps .*?, ([0-9.]+) ms/step", re.M)


def swap_sets(swap):
    return ["zero_optimization.offload_param.nvme_path=" + swap,
            "zero_optimization.offload_optimizer.nvme_path=" + swap,
            "activation_checkpointing.nvme_path=" + swap + "/activations"]


def sets_args(sets):
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def predicted(build, config, profile, sets):
    out = subprocess.run([os.path.join(build, "tools/zinfinity-plan"), "--config", config,
                          "--profile", profile, "--json"] + sets_args(sets),
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"zinfinity-plan failed on {config}:\n{out.stdout}\n{out.stderr}")
    rank = json.loads(out.stdout)["per_rank"][0]
    if "step_s" not in rank.get("step_time", {}):
        sys.exit(f"no step time for {config}: {rank.get('step_time')}")
    return rank["step_time"]


def trained_seconds(build, config, steps, sets):
    cmd = [os.path.join(build, "tools/zinfinity-train"), "--config", config, "--progress", "off",
           "--no-eval", "--max-steps", str(steps)] + sets_args(sets)
    out = subprocess.run(cmd, capture_output=True, text=True)
    m = SUMMARY.search(out.stdout + out.stderr)
    if out.returncode != 0 or m is None:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    if int(m.group(1)) != steps:
        sys.exit(f"{config}: ran {m.group(1)} steps, asked {steps}")
    return int(m.group(1)) * float(m.group(2)) / 1e3


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="zinfinity-bench profile's output")
    ap.add_argument("--build", default=os.path.join(root, "build-release"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--swap", default=None, help="directory for swap files (default: a temp dir)")
    ap.add_argument("--configs", default=",".join(STEPS), help="comma-separated config names")
    args = ap.parse_args()
    swap = args.swap or tempfile.mkdtemp(prefix="zinf-plan-vs-")
    names = args.configs.split(",")
    measured = {n: [] for n in names}
    try:
        sets = {n: swap_sets(os.path.join(swap, n)) + EXTRA.get(n, []) for n in names}
        pred = {n: predicted(args.build, os.path.join(root, "configs", n + ".json"), args.profile,
                             sets[n]) for n in names}
        for r in range(args.rounds):
            for n in names:
                config = os.path.join(root, "configs", n + ".json")
                short, long = STEPS[n]
                t1 = trained_seconds(args.build, config, short, sets[n])
                t2 = trained_seconds(args.build, config, long, sets[n])
                measured[n].append((t2 - t1) / (long - short))
                print(f"round {r + 1}: {n}: {measured[n][-1] * 1e3:.1f} ms/step", flush=True)
    finally:
        if args.swap is None:
            shutil.rmtree(swap, ignore_errors=True)
    print(f"\n{'config':<20} {'measured':>11} {'predicted':>11} {'ratio':>7}   "
          f"predicted compute / I/O / exposed")
    errors = []
    for n in names:
        m = statistics.median(measured[n])
        p = pred[n]
        ratio = p["step_s"] / m
        errors.append(abs(ratio - 1))
        print(f"{n:<20} {m * 1e3:8.1f} ms {p['step_s'] * 1e3:8.1f} ms {ratio:7.3f}   "
              f"{p['compute_s'] * 1e3:.1f} / {p['io_s'] * 1e3:.1f} / "
              f"{p['exposed_io_s'] * 1e3:.1f} ms")
    print(f"\nmedian |predicted / measured - 1| over {len(names)} configs: "
          f"{statistics.median(errors) * 100:.1f} % (largest {max(errors) * 100:.1f} %); "
          f"measured: medians of {args.rounds} rounds")


if __name__ == "__main__":
    main()
