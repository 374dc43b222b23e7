"""zinfinity.initialize on several ranks (mpirun -np N python ...): data-parallel ZeRO over the
engine's MPI communicator takes bitwise the steps of one rank accumulating the micro-batches."""

import json
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "ranks_script.py")
MPIRUN = shutil.which("mpirun")


def run(workdir, name, ranks, stage, micro, gas, *extra):
    out = os.path.join(workdir, name + ".json")
    cmd = [sys.executable, SCRIPT, out, str(stage), str(micro), str(gas), *extra]
    if ranks > 1:
        cmd = [MPIRUN, "--oversubscribe", "-np", str(ranks)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        return json.load(f)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed (openmpi-bin)")
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_two_and_four_ranks_take_one_ranks_accumulated_steps(workdir, stage):
    """N ranks with one micro-batch each against one rank accumulating the N micro-batches, in
    rank order (comm.deterministic adds in rank order; 1/N is exact for N = 2, 4)."""
    one = run(workdir, "one", 1, stage, 4, 2)
    two = run(workdir, "two", 2, stage, 4, 1)
    assert (one["world"], two["world"]) == (1, 2)
    assert two["weights"] == one["weights"]
    if stage == 0:
        one4 = run(workdir, "one4", 1, stage, 4, 4)
        four = run(workdir, "four", 4, stage, 4, 1)
        assert four["world"] == 4 and four["weights"] == one4["weights"]


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed (openmpi-bin)")
def test_a_checkpoint_of_two_ranks_resumes_on_one(workdir):
    ckpt = os.path.join(workdir, "ckpt")
    straight = run(workdir, "straight", 2, 1, 4, 1, ckpt)
    resumed = run(workdir, "resumed", 1, 1, 4, 2, ckpt, "resume")  # one rank accumulating
    assert resumed["weights"] == straight["weights"]
