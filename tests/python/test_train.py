"""nopad.Trainer over nopad_train, on the tiny BERTs of tests/data/train (hidden 32, 2 layers, the
64-id vocab.txt; the two-label data of scripts/make_train_cli_data.py): about a second in all.

- classification with an eval file: the loss falls, the eval accuracy is reported, the callback
  sees every step in order, the output folder is a model folder;
- a run stopped from the callback and resumed from its checkpoint gives every step's loss of a
  run that did not stop, bit for bit, and the same final weights;
- an exception in the callback stops the run and is raised by train();
- masked LM with LAMB and a per-step log; with whole-word masking and with packed lines, each
  recorded and kept on resume;
- evaluations during the run (eval_every, "epoch"): on_eval sees each, as the log has them; the
  best (by accuracy, or by loss) kept in out/best with the weights of a run stopped there; a run
  stopped before or after evaluations and resumed keeps the history and best; on_eval stopping
  the run; early_stop, with and without a min_delta; the option errors;
- the dropout rates (config.json's, dropout=, attention_dropout=, the attention's following
  dropout= when unset) recorded in trainer_state.json; bad rates and a resume with another rate
  refused;
- errors: bad options, a resume with another optimiser (both named), a missing file, CUDA on a
  build without CUDA training;
- the ctypes structs of training (nopad_train_params, _result, _progress, _eval) against the header's
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


def test_mlm_whole_word_mask(mlm_model, tmp_path):
    """Whole-word masking trains, is recorded in the checkpoint, and a resume must keep it."""
    lines = tmp_path / "train.txt"
    lines.write_text("".join(json.loads(l)["text"] + "\n"
                             for l in open(TRAIN / "cls_train.jsonl")))
    opts = dict(task="mlm", lr=1e-3, epochs=2, batch_tokens=64, threads=2, whole_word_mask=True)
    m = nopad.Trainer(mlm_model, lines, tmp_path / "out", **opts).train(on_step=lambda p: p.step == 3)
    assert m.steps == 3 and m.last_loss > 0
    state = json.load(open(tmp_path / "out" / "trainer_state.json"))
    assert state["data"]["whole_word_mask"] is True
    opts["whole_word_mask"] = False
    with pytest.raises(nopad.InvalidArgumentError, match="whole_word_mask 0, but the checkpoint's is 1"):
        nopad.Trainer(mlm_model, lines, tmp_path / "out", resume=tmp_path / "out", **opts).train()
    with pytest.raises(nopad.InvalidArgumentError, match="whole_word_mask is for task='mlm'"):
        nopad.Trainer(mlm_model, lines, tmp_path / "o", task="classify", whole_word_mask=True)


def test_mlm_pack_lines(mlm_model, tmp_path):
    """Packed lines: fewer, full-length examples; recorded, and a resume must keep it."""
    lines = tmp_path / "train.txt"
    lines.write_text("".join(json.loads(l)["text"] + "\n"
                             for l in open(TRAIN / "cls_train.jsonl")))
    opts = dict(task="mlm", lr=1e-3, epochs=1, batch_tokens=512, threads=2)
    plain = nopad.Trainer(mlm_model, lines, tmp_path / "a", **opts).train()
    m = nopad.Trainer(mlm_model, lines, tmp_path / "b", pack_lines=True, **opts).train(
        on_step=lambda p: p.step == 1)
    assert m.n_examples < plain.n_examples and m.steps == 1
    assert json.load(open(tmp_path / "b" / "trainer_state.json"))["data"]["pack_lines"] is True
    with pytest.raises(nopad.InvalidArgumentError, match="pack_lines 0, but the checkpoint's is 1"):
        nopad.Trainer(mlm_model, lines, tmp_path / "b", resume=tmp_path / "b", **opts).train()
    with pytest.raises(nopad.InvalidArgumentError, match="pack_lines is for task='mlm'"):
        nopad.Trainer(mlm_model, lines, tmp_path / "o", task="classify", pack_lines=True)
    with pytest.raises(nopad.InvalidArgumentError, match="does not stream yet"):
        nopad.Trainer(mlm_model, lines, tmp_path / "o", task="mlm", pack_lines=True, stream=True)


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
               "nopad_train_progress": _native.TrainProgress, "nopad_train_eval": _native.TrainEval}
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


def test_eval_every_save_best_and_resume(cls_model, tmp_path):
    # evaluations every 5 steps and at the last (24): on_eval sees each, in order, the same as the
    # log; the best by accuracy (the default for classification; ties to the earlier step) has its
    # weights in out/best: the bytes of a run stopped there; stopped before it and resumed, the
    # run keeps the same history and best
    data, ev = TRAIN / "cls_train.jsonl", TRAIN / "cls_eval.jsonl"
    opts = fast(epochs=3, eval_data=ev, eval_every=5, save_best=True)
    seen = []
    m = nopad.Trainer(cls_model, data, tmp_path / "a", log=tmp_path / "a.jsonl", **opts).train(
        on_eval=seen.append)
    assert [e.step for e in seen] == [5, 10, 15, 20, 24] and m.evals == tuple(seen)
    assert all(e.metric == "accuracy" and e.examples == 32 and e.evaluations == i + 1
               for i, e in enumerate(seen))
    accs = [e.accuracy for e in seen]
    best = seen[accs.index(max(accs))]
    assert m.best_step == best.step and m.best_value == best.accuracy and m.best_metric == "accuracy"
    assert m.evaluations == 5 and not m.early_stopped
    assert [e.is_best for e in seen] == [a > max(accs[:i], default=-1) for i, a in enumerate(accs)]
    assert seen[-1].best_step == best.step and seen[-1].since_best == 4 - accs.index(max(accs))
    logged = [json.loads(l) for l in open(tmp_path / "a.jsonl")]
    assert [(r["step"], r["eval_loss"], r["eval_accuracy"]) for r in logged if "eval_loss" in r] == \
        [(e.step, e.loss, e.accuracy) for e in seen]
    assert m.eval_loss == seen[-1].loss and m.eval_accuracy == seen[-1].accuracy
    results = json.loads((tmp_path / "a" / "best" / "eval_results.json").read_text())
    assert results["step"] == best.step and results["eval_loss"] == best.loss
    nopad.Trainer(cls_model, data, tmp_path / "at", **fast(epochs=3)).train(
        on_step=lambda p: p.step == best.step)
    assert (tmp_path / "a" / "best" / "model.safetensors").read_bytes() == \
        (tmp_path / "at" / "model.safetensors").read_bytes()
    # stopped at step 3 (before every evaluation) or 12 (after two), resumed
    for k in (3, 12):
        first = nopad.Trainer(cls_model, data, tmp_path / f"b{k}", **opts).train(
            on_step=lambda p: p.step == k)
        rest = nopad.Trainer(cls_model, data, tmp_path / f"b{k}", resume=tmp_path / f"b{k}",
                             **opts).train()
        assert first.evals + rest.evals == m.evals and rest.evaluations == 5
        assert rest.best_step == m.best_step and rest.best_value == m.best_value
        assert (tmp_path / "a" / "best" / "model.safetensors").read_bytes() == \
            (tmp_path / f"b{k}" / "best" / "model.safetensors").read_bytes()
    # the metric by loss instead: lower is better
    m2 = nopad.Trainer(cls_model, data, tmp_path / "c", **fast(epochs=2, eval_data=ev,
                                                               eval_every="epoch",
                                                               best_metric="loss")).train()
    assert [e.step for e in m2.evals] == [8, 16] and m2.best_metric == "loss"
    assert m2.best_value == min(e.loss for e in m2.evals)


def test_on_eval_stops_and_early_stop(mlm_model, tmp_path):
    lines = tmp_path / "train.txt"
    lines.write_text("".join(json.loads(l)["text"] + "\n"
                             for l in open(TRAIN / "cls_train.jsonl")))
    opts = dict(task="mlm", lr=2e-2, warmup=0, epochs=8, batch_tokens=64, threads=2,
                eval_data=lines, eval_every=5)
    # on_eval returning true stops the run after that evaluation's step
    m = nopad.Trainer(mlm_model, lines, tmp_path / "a", **opts).train(
        on_eval=lambda e: e.step == 10)
    assert m.steps == 10 and [e.step for e in m.evals] == [5, 10] and not m.early_stopped
    assert m.best_metric == "loss"
    # early_stop: the third evaluation in a row without a new best ends it
    m = nopad.Trainer(mlm_model, lines, tmp_path / "b", early_stop=3, **opts).train()
    assert m.early_stopped and m.evals[-1].since_best == 3 and m.steps == m.evals[-1].step
    assert all(e.since_best < 3 for e in m.evals[:-1]) and m.steps < 64
    # early_stop_min_delta: no improvement is that large, so the run stops two evaluations after
    # its first, whatever the losses do
    m = nopad.Trainer(mlm_model, lines, tmp_path / "c", early_stop=2, early_stop_min_delta=1e9,
                      **opts).train()
    assert m.early_stopped and [e.step for e in m.evals] == [5, 10, 15] and m.steps == 15
    with pytest.raises(nopad.InvalidArgumentError, match="early_stop_min_delta needs early_stop"):
        nopad.Trainer(mlm_model, lines, tmp_path / "d", early_stop_min_delta=0.1, **opts)
    with pytest.raises(nopad.InvalidArgumentError, match="early_stop_min_delta -1"):
        nopad.Trainer(mlm_model, lines, tmp_path / "d", early_stop=2, early_stop_min_delta=-1, **opts)


def test_eval_errors(cls_model, mlm_model, tmp_path):
    data, ev = TRAIN / "cls_train.jsonl", TRAIN / "cls_eval.jsonl"
    with pytest.raises(nopad.InvalidArgumentError, match="eval_every needs eval_data"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", eval_every=5)
    with pytest.raises(nopad.InvalidArgumentError, match="save_best needs eval_every"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", eval_data=ev,
                      save_best=True)
    with pytest.raises(nopad.InvalidArgumentError, match="save_best needs eval_data"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", save_best=True)
    with pytest.raises(nopad.InvalidArgumentError, match="eval_every -1"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", eval_data=ev,
                      eval_every=-1)
    with pytest.raises(nopad.InvalidArgumentError, match="eval_every 'step'"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", eval_data=ev,
                      eval_every="step")
    with pytest.raises(nopad.InvalidArgumentError, match="best_metric 'f1'"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", eval_data=ev,
                      eval_every=5, best_metric="f1")
    with pytest.raises(nopad.InvalidArgumentError, match="best_metric 'accuracy' is for"):
        nopad.Trainer(mlm_model, data, tmp_path / "o", task="mlm", eval_data=ev, eval_every=5,
                      best_metric="accuracy")
    with pytest.raises(nopad.InvalidArgumentError, match="early_stop -2"):
        nopad.Trainer(cls_model, data, tmp_path / "o", task="classify", eval_data=ev,
                      eval_every=5, early_stop=-2)


def test_dropout_rates(cls_model, tmp_path):
    """The rates a run trains with, recorded in trainer_state.json: config.json's by default
    (hidden 0.05 and attention 0.1 here, so a mix-up shows), dropout= for both when
    attention_dropout= is unset, attention_dropout= alone; no warning either way. Bad rates are
    errors (from Python and from the library), and a resume with another rate is refused."""
    import warnings
    d = tmp_path / "model"
    shutil.copytree(cls_model, d)
    config = json.loads((d / "config.json").read_text())
    config.update(attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.05)
    (d / "config.json").write_text(json.dumps(config))
    data = TRAIN / "cls_train.jsonl"
    assert nopad.Trainer(d, data, tmp_path / "o")._params.attention_dropout == -1  # the default
    cases = [({}, (0.05, 0.1)), ({"dropout": 0}, (0, 0)), ({"dropout": 0.2}, (0.2, 0.2)),
             ({"dropout": 0, "attention_dropout": 0.2}, (0, 0.2)),
             ({"attention_dropout": 0}, (0.05, 0)), ({"attention_dropout": 0.3}, (0.05, 0.3))]
    for i, (kw, want) in enumerate(cases):
        out = tmp_path / ("r%d" % i)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nopad.Trainer(d, data, out, **fast(epochs=1, **kw)).train(on_step=lambda p: True)
        state = json.loads((out / "trainer_state.json").read_text())
        assert (state["dropout"], state["attention_dropout"]) == want, (kw, state)
        saved = json.loads((out / "config.json").read_text())
        assert saved["attention_probs_dropout_prob"] == 0.1 and saved["hidden_dropout_prob"] == 0.05
    for bad in (1, -0.5, 1.5):
        with pytest.raises(nopad.InvalidArgumentError, match="attention_dropout %r" % (bad,)):
            nopad.Trainer(d, data, tmp_path / "o", attention_dropout=bad)
    t = nopad.Trainer(d, data, tmp_path / "o", **fast(epochs=1))
    t._params.attention_dropout = 2  # past the Python check: the library's own
    with pytest.raises(nopad.InvalidArgumentError, match=r"attention_dropout 2 is outside \[0, 1\)"):
        t.train()
    # r3 trained with attention dropout 0.2: resumed with it, or refused with another rate
    with pytest.raises(nopad.InvalidArgumentError,
                       match="attention_dropout 0, but the checkpoint's is 0.2;"):
        nopad.Trainer(d, data, tmp_path / "r3b", resume=tmp_path / "r3",
                      **fast(epochs=1, dropout=0)).train()
    # without rates it keeps its own (0 and 0.2, not config.json's 0.05 and 0.1)
    nopad.Trainer(d, data, tmp_path / "r3c", resume=tmp_path / "r3", **fast(epochs=1)).train()
    s = json.loads((tmp_path / "r3c" / "trainer_state.json").read_text())
    assert (s["dropout"], s["attention_dropout"]) == (0, 0.2)
    m = nopad.Trainer(d, data, tmp_path / "r3", resume=tmp_path / "r3",
                      **fast(epochs=1, dropout=0, attention_dropout=0.2)).train()
    assert m.resumed_step == 1 and m.steps > 1
