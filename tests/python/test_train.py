"""nopad.Trainer over nopad_train, on the tiny BERTs of tests/data/train (hidden 32, 2 layers, the
64-id vocab.txt; the two-label data of scripts/make_train_cli_data.py): about a second in all.

- classification with an eval file: the loss falls, the eval accuracy is reported, the callback
  sees every step in order, the output folder is a model folder;
- a run stopped from the callback and resumed from its checkpoint gives every step's loss of a
  run that did not stop, bit for bit, and the same final weights;
- an exception in the callback stops the run and is raised by train();
- masked LM with LAMB and a per-step log;
- errors: bad options, a resume with another optimiser (both named), a missing file, CUDA on a
  build without CUDA training;
- the ctypes structs of training (nopad_train_params, _result, _progress) against the header's
  offsets and sizes, by a C program compiled here.
"""
import ctypes
import json
import os
import shutil
import subprocess

import pytest

import nopad
from nopad import _native

from conftest import DATA, REPO

TRAIN = DATA / "train"


@pytest.fixture(scope="module")
def cls_model(tmp_path_factory):
    """The 3-label classification checkpoint with its tokenizer."""
    d = tmp_path_factory.mktemp("bert_cls")
    for f in ("config.json", "model.safetensors"):
        shutil.copy(TRAIN / "bert_cls" / f, d / f)
    shutil.copy(TRAIN / "vocab.txt", d / "vocab.txt")
    return d


@pytest.fixture(scope="module")
def mlm_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert_mlm")
    for f in ("config.json", "model.safetensors"):
        shutil.copy(TRAIN / "bert_mlm" / f, d / f)
    shutil.copy(TRAIN / "vocab.txt", d / "vocab.txt")
    return d


def fast(**kw):
    """Options for a run of a few dozen tiny steps."""
    opts = dict(task="classify", lr=3e-3, batch_tokens=64, batch_seqs=8, threads=2)
    opts.update(kw)
    return opts


def test_classify_with_eval_and_callback(cls_model, tmp_path):
    seen = []
    trainer = nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "out",
                            eval_data=TRAIN / "cls_eval.jsonl", **fast(epochs=8))
    m = trainer.train(on_step=seen.append)
    assert m.steps == len(seen) > 8 and m.resumed_step == 0
    assert [p.step for p in seen] == list(range(1, m.steps + 1))
    assert all(p.total_steps == m.steps and p.epochs == 8 for p in seen)
    assert [p.epoch for p in seen] == sorted(p.epoch for p in seen) and seen[-1].epoch == 7
    assert seen[0].lr == 0.0 and max(p.lr for p in seen) == pytest.approx(3e-3)  # HF's warmup
    assert m.first_loss == seen[0].loss and m.last_loss == seen[-1].loss
    assert m.last_loss < m.first_loss / 2, (m.first_loss, m.last_loss)
    assert m.num_labels == 3 and not m.new_head and m.n_examples == 64
    assert m.eval_examples == 32 and m.eval_accuracy >= 0.9 and m.eval_loss > 0
    for f in ("config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json",
              "vocab.txt"):
        assert (tmp_path / "out" / f).is_file(), f
    with nopad.Encoder(tmp_path / "out") as enc:
        assert enc.encode(["aa ab ac"]).shape == (1, 32)


def test_stop_and_resume_equal_a_straight_run(cls_model, tmp_path):
    opts = fast(epochs=3)
    straight = []
    nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "a", **opts).train(
        on_step=lambda p: straight.append(p.loss))
    first = []
    m1 = nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "b", **opts).train(
        on_step=lambda p: first.append(p.loss) or p.step == 5)
    assert m1.steps == 5 and len(first) == 5
    rest = []
    m2 = nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "b", resume=tmp_path / "b",
                       **opts).train(on_step=lambda p: rest.append(p.loss))
    assert m2.resumed_step == 5 and m2.steps == len(straight)
    assert first + rest == straight  # bit for bit
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "model.safetensors").read_bytes()
    # another optimiser cannot continue it: both named
    with pytest.raises(nopad.InvalidArgumentError, match="optimizer lamb, but the checkpoint was "
                                                         "trained with adamw"):
        nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "c", resume=tmp_path / "b",
                      optimizer="lamb", **opts).train()


def test_stream_stop_and_resume_equal_a_straight_run(cls_model, tmp_path):
    # the data read in windows of 1 KiB (3 an epoch), stopped inside the second window
    opts = fast(epochs=2, stream=True, stream_buffer=1024)
    straight = []
    m = nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "a", **opts).train(
        on_step=lambda p: straight.append(p.loss))
    assert m.n_examples == 64 and len(straight) > 8
    first, rest = [], []
    nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "b", **opts).train(
        on_step=lambda p: first.append(p.loss) or p.step == 6)
    nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "b", resume=tmp_path / "b",
                  **opts).train(on_step=lambda p: rest.append(p.loss))
    assert first + rest == straight  # bit for bit
    with pytest.raises(nopad.InvalidArgumentError, match="stream buffer"):
        nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "c", resume=tmp_path / "b",
                      **fast(epochs=2)).train()
    with pytest.raises(nopad.InvalidArgumentError, match="stream_buffer 100"):
        nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "d", stream=True,
                      stream_buffer=100)


def test_callback_exception_stops_and_is_raised(cls_model, tmp_path):
    steps = []

    def boom(p):
        steps.append(p.step)
        if p.step == 2:
            raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        nopad.Trainer(cls_model, TRAIN / "cls_train.jsonl", tmp_path / "out", **fast()).train(boom)
    assert steps == [1, 2]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["step"] == 2  # the checkpoint of where it stopped


def test_mlm_lamb_with_log(mlm_model, tmp_path):
    lines = tmp_path / "train.txt"
    lines.write_text("".join(json.loads(l)["text"] + "\n"
                             for l in open(TRAIN / "cls_train.jsonl")))
    m = nopad.Trainer(mlm_model, lines, tmp_path / "out", task="mlm", optimizer="lamb", lr=1e-3,
                      epochs=2, batch_tokens=64, eval_data=lines, log=tmp_path / "log.jsonl",
                      threads=2).train()
    rows = [json.loads(l) for l in open(tmp_path / "log.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, m.steps + 1))
    assert rows[-1]["loss"] == m.last_loss
    assert m.eval_accuracy is None and m.eval_loss > 0 and m.num_labels == 0


def test_errors(cls_model, mlm_model, tmp_path):
    data = TRAIN / "cls_train.jsonl"
    with pytest.raises(nopad.InvalidArgumentError, match="task 'ner'"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="ner")
    with pytest.raises(nopad.InvalidArgumentError, match="optimizer 'sgd'"):
        nopad.Trainer(cls_model, data, tmp_path / "o", optimizer="sgd")
    with pytest.raises(nopad.InvalidArgumentError, match="num_labels is for task='classify'"):
        nopad.Trainer(mlm_model, data, tmp_path / "o", task="mlm", num_labels=2)
    with pytest.raises(nopad.InvalidArgumentError, match="warmup"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", warmup=2.5)
    with pytest.raises(nopad.InvalidArgumentError, match="model is required"):
        nopad.Trainer(None, data, tmp_path / "o")
    with pytest.raises(nopad.InvalidArgumentError, match="epochs 0"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", epochs=0).train()
    with pytest.raises(nopad.FileError, match="missing.jsonl"):
        nopad.Trainer(cls_model, tmp_path / "missing.jsonl", tmp_path / "o", task="classify").train()
    with pytest.raises(nopad.InvalidArgumentError, match="device 'tpu'"):
        nopad.Trainer(cls_model, data, tmp_path / "o", device="tpu")
    # CUDA: trains where the build has CUDA training, else a clear error naming what is missing
    try:
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", device="cuda",
                      epochs=1).train()
    except nopad.NopadError as e:
        assert "cuda" in str(e).lower(), e


def test_struct_layouts_match_the_header(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    structs = {"nopad_train_params": _native.TrainParams, "nopad_train_result": _native.TrainResult,
               "nopad_train_progress": _native.TrainProgress}
    src = ["#include <stddef.h>", "#include <stdio.h>", "#include \"nopad.h\"", "int main(void) {"]
    for name, cls in structs.items():
        for field, _ in cls._fields_:
            src.append('    printf("%s %s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                       % (name, field, name, field, name, field))
        src.append('    printf("%s - %%zu -\\n", sizeof(%s));' % (name, name))
    src += ["    return 0;", "}"]
    (tmp_path / "abi.c").write_text("\n".join(src) + "\n")
    proc = subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), str(tmp_path / "abi.c"),
                           "-o", str(tmp_path / "abi")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr  # a field the header lacks fails here
    out = subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        struct, field, offset, size = line.split()
        cls = structs[struct]
        if field == "-":  # a field ctypes lacks shows as a size difference
            assert ctypes.sizeof(cls) == int(offset), struct
            continue
        desc = getattr(cls, field)
        assert (desc.offset, desc.size) == (int(offset), int(size)), (struct, field)
