"""Non-finite weights are refused at load, the same way on every interface (issue 19, item 4):
the Python package raises FormatError and the CLI exits with the same message, both naming the
tensor and the element, instead of returning NaN embeddings."""
import math
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import nopad
from conftest import MODELS

TENSOR = "encoder.layer.1.output.dense.weight"


@pytest.fixture(params=[math.nan, math.inf], ids=["nan", "inf"])
def bad_folder(request, tmp_path):
    shutil.copy(MODELS / "bert_a" / "config.json", tmp_path / "config.json")
    weights = load_file(str(MODELS / "bert_a" / "model.safetensors"))
    w = weights[TENSOR].copy()
    w.reshape(-1)[100] = np.float32(request.param)
    weights[TENSOR] = w
    save_file(weights, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_python_refuses_non_finite_weights(bad_folder):
    with pytest.raises(nopad.FormatError) as e:
        nopad.Encoder(bad_folder)
    assert TENSOR in str(e.value) and "element 100" in str(e.value)


def test_cli_refuses_non_finite_weights(bad_folder, cli):
    run = subprocess.run([str(cli), "info", "--model", str(bad_folder)], capture_output=True, text=True)
    assert run.returncode == 1
    assert TENSOR in run.stderr and "element 100" in run.stderr
