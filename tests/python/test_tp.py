"""Tensor parallelism from Python (nopad.tp_follow, tp_size, world_rank / world_size): outside a
launcher a split is refused with what to run instead; under mpirun -np 2 a script whose rank 0
generates and whose rank 1 follows gives the ids of one process (skipped without mpirun)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nopad
from conftest import MODELS, REPO

LLAMA = MODELS / "llama_gqa"  # 8 query heads, 2 key/value heads: tp 2 splits both


def test_world_outside_a_launcher(monkeypatch):
    for name in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                 "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    assert nopad.world_rank() == 0
    assert nopad.world_size() == 1


@pytest.mark.parametrize("make", [lambda: nopad.Generator(LLAMA, tp_size=2),
                                  lambda: nopad.Encoder(MODELS / "bert_a", tp_size=2),
                                  lambda: nopad.tp_follow(LLAMA, tp_size=2)])
def test_a_split_without_a_launcher_is_refused(make):
    if nopad.world_size() != 1:
        pytest.skip("run under a launcher")
    with pytest.raises(nopad.InvalidArgumentError, match=r"tp_size=2 .* mpirun -np 2"):
        make()


def test_bad_tp_size():
    with pytest.raises(nopad.InvalidArgumentError, match="tp_size must be in"):
        nopad.Generator(LLAMA, tp_size=0)
    with pytest.raises(TypeError):
        nopad.Generator(LLAMA, tp_size="2")
    with pytest.raises(nopad.InvalidArgumentError, match="tp_follow needs tp_size > 1"):
        nopad.tp_follow(LLAMA, tp_size=1)


def test_tp_size_1_is_one_process():
    with nopad.Generator(LLAMA, tp_size=1) as gen:
        assert gen.info.num_layers > 0


# Rank 0 prints the greedy ids of three prompts (random ids from a fixed seed) as JSON; rank 1
# follows until rank 0 closes its model.
SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    import nopad
    model, tp = sys.argv[1], nopad.world_size()
    if nopad.world_rank() == 0:
        rng = np.random.default_rng(7)
        prompts = [rng.integers(0, 300, n).tolist() for n in (5, 17, 2)]
        with nopad.Generator(model, tp_size=tp, threads=1) as gen:
            ids = gen.generate_ids(prompts, max_tokens=12, ignore_eos=True)
        print(json.dumps([np.asarray(x).tolist() for x in ids]))
    else:
        nopad.tp_follow(model, tp_size=tp, threads=1)
""")


def test_mpirun_two_ranks_give_the_ids_of_one(tmp_path):
    mpirun = os.environ.get("NOPAD_MPIRUN") or shutil.which("mpirun")
    if not mpirun:
        pytest.skip("needs Open MPI's mpirun (apt-get install openmpi-bin)")
    script = tmp_path / "tp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, NOPAD_LIBRARY=str(nopad.library_path()))
    args = [str(script), str(LLAMA), str(REPO / "python")]
    one = subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stderr
    launch = [mpirun, "-np", "2", "--bind-to", "none", "--oversubscribe"]
    if os.geteuid() == 0:
        launch.append("--allow-run-as-root")
    two = subprocess.run(launch + [sys.executable] + args, env=env, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    want = json.loads(one.stdout)
    assert [len(x) for x in want] == [12, 12, 12]
    assert json.loads(two.stdout) == want
