"""Tensor parallelism from Python (nopad.tp_follow, tp_size, world_rank / world_size): outside a
launcher tp_size=N starts N - 1 nopad-worker processes and gives the ids (and hidden states) of one
process, a killed worker fails the caller's call instead of hanging it, and a worker program that
cannot serve is refused; under mpirun -np 2 a script whose rank 0 generates and whose rank 1
follows gives the ids of one process (skipped without mpirun)."""
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


def test_tp_follow_without_a_launcher_is_refused():
    if nopad.world_size() != 1:
        pytest.skip("run under a launcher")
    with pytest.raises(nopad.InvalidArgumentError, match=r"no launcher .* tp_size 2 starts"):
        nopad.tp_follow(LLAMA, tp_size=2)


# With no launcher, tp_size=N starts N - 1 nopad-worker processes (beside libnopad.so). Each case
# runs in a child process of its own: MPI starts once a process, and a world that lost a rank
# leaves MPI in that process unusable.
SPAWN = textwrap.dedent("""
    import faulthandler, json, sys
    import numpy as np
    faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where, before the test's 240 s
    sys.path.insert(0, sys.argv[2])
    import nopad
    model, case = sys.argv[1], sys.argv[3]
    rng = np.random.default_rng(7)
    if case == "generate":
        prompts = [rng.integers(0, 300, n).tolist() for n in (5, 17, 1)]
        out = {}
        for tp in (1, 2, 4, 2):  # 2 again: a second split model in the same process
            with nopad.Generator(model, tp_size=tp, threads=1) as gen:
                out[str(tp)] = [np.asarray(x).tolist()
                                for x in gen.generate_ids(prompts, max_tokens=10, ignore_eos=True)]
        print(json.dumps(out))
    elif case == "encode":
        ids = rng.integers(5, 90, 23).astype(np.int32)
        cu = np.array([0, 1, 9, 23], dtype=np.int32)
        out = {}
        for tp in (1, 2):
            with nopad.Encoder(model, tp_size=tp, threads=1) as enc:
                out[str(tp)] = np.asarray(enc.forward(ids, cu)).tolist()
        print(json.dumps(out))
    elif case == "kill":
        import os, signal, threading, time
        gen = nopad.Generator(model, tp_size=2, threads=1)
        me = str(os.getpid())
        def parent(pid):
            with open("/proc/%s/stat" % pid) as f:
                return f.read().rsplit(")", 1)[1].split()[1]
        def workers():  # nopad-worker processes under this one (through Open MPI's daemon)
            found = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        if b"nopad-worker" not in f.read():
                            continue
                    up = parent(pid)
                    if up == me or parent(up) == me:
                        found.append(int(pid))
                except (OSError, IndexError):
                    pass
            return found
        assert len(workers()) == 1, workers()
        threading.Timer(1.0, lambda: [os.kill(p, signal.SIGKILL) for p in workers()]).start()
        start = time.monotonic()
        try:
            while time.monotonic() - start < 60:
                gen.generate_ids([[5, 6, 7]], max_tokens=16)
            print(json.dumps({"error": None}))
        except nopad.NopadError as e:
            took = time.monotonic() - start
            gen.close()
            time.sleep(0.5)
            print(json.dumps({"error": str(e), "seconds": took, "left": workers()}))
    elif case == "bad-worker":
        try:
            nopad.Generator(model, tp_size=2)
            print(json.dumps({"error": None}))
        except nopad.FileError as e:
            print(json.dumps({"error": str(e)}))
""")


def _spawn(tmp_path, model, case, **env):
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    env = dict(os.environ, NOPAD_LIBRARY=str(nopad.library_path()), **env)
    proc = subprocess.run([sys.executable, str(script), str(model), str(REPO / "python"), case],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def no_launcher():
    if nopad.world_size() != 1:
        pytest.skip("run without a launcher")
    if not (nopad.library_path().parent / "nopad-worker").is_file():
        pytest.skip("nopad-worker is not built beside %s" % nopad.library_path())


def test_no_launcher_starts_the_workers(tmp_path, no_launcher):
    out, _ = _spawn(tmp_path, LLAMA, "generate")
    assert [len(x) for x in out["1"]] == [10, 10, 10]
    assert out["2"] == out["1"] and out["4"] == out["1"]


def test_no_launcher_encoder(tmp_path, no_launcher):
    out, _ = _spawn(tmp_path, MODELS / "bert_a", "encode")
    one, two = np.asarray(out["1"]), np.asarray(out["2"])
    # float32 on both sides; the split only reorders the row-parallel sums (as mpi_tp_encoder.c)
    err = np.linalg.norm(two - one, axis=1) / np.linalg.norm(one, axis=1)
    assert err.max() <= 1e-5


def test_a_killed_worker_fails_the_leader_not_hangs_it(tmp_path, no_launcher):
    out, stderr = _spawn(tmp_path, LLAMA, "kill")
    assert out["error"] is not None, "generation went on with a worker killed"
    assert "worker rank 1" in out["error"] and "ended unexpectedly" in out["error"]
    assert out["seconds"] < 60
    assert out["left"] == []


def test_a_worker_program_that_cannot_serve_is_refused(tmp_path, no_launcher):
    out, _ = _spawn(tmp_path, LLAMA, "bad-worker", NOPAD_TP_WORKER="/bin/false")
    assert out["error"] and "cannot serve as this library's worker" in out["error"]


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
    import faulthandler, json, sys
    import numpy as np
    faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where, before the test's 240 s
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
