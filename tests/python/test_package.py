"""The package itself: ABI against include/nopad.h, versions, error classes, the wheel build."""
import ctypes
import os
import re
import subprocess
import sys
import zipfile

import pytest

import nopad
from nopad import _native
from conftest import REPO


def test_struct_layouts_match_the_header(capi_helper):
    out = subprocess.run([str(capi_helper), "abi"], capture_output=True, text=True, check=True)
    structs = {"nopad_tokenize_params": _native.TokenizeParams,
               "nopad_model_params": _native.ModelParams,
               "nopad_model_info": _native.ModelInfo,
               "nopad_model_stats": _native.ModelStats,
               "nopad_encode_params": _native.EncodeParams,
               "nopad_context_params": _native.ContextParams,
               "nopad_sampling_params": _native.SamplingParams,
               "nopad_generate_params": _native.GenerateParams,
               "nopad_batch": _native.Batch}
    seen = {name: [] for name in structs}
    for line in out.stdout.splitlines():
        struct, field, offset, size = line.split()
        if struct == "enum":
            assert int(offset) == ctypes.sizeof(ctypes.c_int)
            continue
        cls = structs[struct]
        if field == "-":
            assert ctypes.sizeof(cls) == int(offset), struct
            continue
        desc = getattr(cls, field)
        assert (desc.offset, desc.size) == (int(offset), int(size)), (struct, field)
        seen[struct].append(field)
    for name, cls in structs.items():  # no field missing on either side
        assert seen[name] == [f for f, _ in cls._fields_], name


def test_every_public_function_is_declared():
    header = (REPO / "include" / "nopad.h").read_text()
    import re
    declared = set(re.findall(r"\b(nopad_[a-z_0-9]+)\s*\(", header))
    missing = declared - set(_native._PROTOTYPES) - set(_native._OPTIONAL)
    assert not missing, "functions of nopad.h without a ctypes prototype: %s" % sorted(missing)


def test_versions_agree():
    header = (REPO / "include" / "nopad.h").read_text()
    import re
    parts = [re.search(r"#define NOPAD_VERSION_%s (\d+)" % k, header).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert nopad.library_version() == ".".join(parts)
    assert nopad.__version__ == nopad.library_version()
    # the checkout the library was built from (git describe at build time) or "unknown"
    build = nopad.library_build_id()
    assert build == "unknown" or re.fullmatch(r"[0-9a-z.-]+", build), build


def test_loaded_with_cdll_so_the_gil_is_released():
    lib = _native.library()
    assert type(lib) is ctypes.CDLL  # PyDLL would hold the GIL during calls
    assert not (lib._func_flags_ & ctypes._FUNCFLAG_PYTHONAPI)


def _env_seen_by_load(monkeypatch, path):
    """The environment libgomp would read: the one ctypes.CDLL runs in (docs/cpu.md)."""
    seen = {}

    def fake_cdll(name, *args, **kwargs):
        seen.update(os.environ)
        return object()

    monkeypatch.setenv("NOPAD_BLAS_PROBE", "0")  # no OpenBLAS probe: only the OpenMP setting
    monkeypatch.setattr(_native.ctypes, "CDLL", fake_cdll)
    _native._load(path)
    return seen


def test_library_load_bounds_openmp_spinning(monkeypatch, tmp_path):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    seen = _env_seen_by_load(monkeypatch, tmp_path / "libnopad.so")
    assert seen.get("GOMP_SPINCOUNT") == "1000"
    assert "GOMP_SPINCOUNT" not in os.environ  # set for the load only
    # a user's choice is kept, either variable
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert "GOMP_SPINCOUNT" not in _env_seen_by_load(monkeypatch, tmp_path / "libnopad.so")
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    assert _env_seen_by_load(monkeypatch, tmp_path / "libnopad.so")["GOMP_SPINCOUNT"] == "300000"


def test_error_classes():
    for status in nopad.Status:
        if status == nopad.Status.OK:
            continue
        err = nopad.errors.error_for(status, "boom")
        assert isinstance(err, nopad.NopadError)
        assert err.status == status and str(err) == "boom" and err.message == "boom"
    assert isinstance(nopad.errors.error_for(2, "x"), OSError)
    assert isinstance(nopad.errors.error_for(1, "x"), ValueError)
    assert isinstance(nopad.errors.error_for(7, "x"), ValueError)
    assert isinstance(nopad.errors.error_for(4, "x"), NotImplementedError)
    assert type(nopad.errors.error_for(99, "x")) is nopad.NopadError


def test_library_search_order(tmp_path):
    code = "import nopad; print(nopad.find_library())"
    env = dict(os.environ, NOPAD_LIBRARY=str(tmp_path / "missing.so"),
               PYTHONPATH=str(REPO / "python"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "NOPAD_LIBRARY" in proc.stderr and "no such file" in proc.stderr
    env["NOPAD_LIBRARY"] = str(nopad.library_path())
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.stdout.strip() == str(nopad.library_path())


def test_wheel_build_bundles_the_library(tmp_path):
    """The in-tree backend, offline, with a given library (no CMake run)."""
    env = dict(os.environ, NOPAD_LIBRARY=str(nopad.library_path()))
    code = ("import sys; sys.path.insert(0, %r); import nopad_build as b; "
            "print(b.build_wheel(%r))" % (str(REPO / "python" / "build_backend"), str(tmp_path)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(REPO / "python"))
    assert proc.returncode == 0, proc.stderr
    wheel = tmp_path / proc.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "nopad/_lib/libnopad.so" in names and "nopad/__init__.py" in names
        assert "nopad/py.typed" in names
        # the workers that tp_size > 1 starts without a launcher, when built beside the library
        if (nopad.library_path().parent / "nopad-worker").is_file():
            assert "nopad/_lib/nopad-worker" in names
            assert zf.getinfo("nopad/_lib/nopad-worker").external_attr >> 16 & 0o111
        meta = zf.read("nopad-%s.dist-info/METADATA" % nopad.__version__).decode()
        assert "Requires-Dist: numpy" in meta
        record = zf.read("nopad-%s.dist-info/RECORD" % nopad.__version__).decode()
        assert all(n in record for n in names)
        assert not any("__pycache__" in n for n in names)


def test_wheel_build_reports_progress(tmp_path):
    """pip hides a backend's output unless -v: the backend says what it does, step by step, on
    stderr (and the terminal), so `pip install ./python` is not a silent minute (issue 38)."""
    env = dict(os.environ, NOPAD_LIBRARY=str(nopad.library_path()), NOPAD_BUILD_QUIET="1")
    code = ("import sys; sys.path.insert(0, %r); import nopad_build as b; "
            "print(b.build_wheel(%r))" % (str(REPO / "python" / "build_backend"), str(tmp_path)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(REPO / "python"))
    assert proc.returncode == 0, proc.stderr
    assert "nopad build: [3/3] bundling %s" % nopad.library_path().resolve() in proc.stderr
    assert "numpy from PyPI when it is missing" in proc.stderr


def test_toml_fallback_reads_our_pyproject():
    sys.path.insert(0, str(REPO / "python" / "build_backend"))
    try:
        import nopad_build
    finally:
        sys.path.pop(0)
    tomllib = pytest.importorskip("tomllib")
    text = (REPO / "python" / "pyproject.toml").read_text()
    assert nopad_build._parse_toml_subset(text) == tomllib.loads(text)


def test_memory_report():
    import numpy as np
    with nopad.Encoder(os.path.join(REPO, "tests", "data", "models", "bert_a")) as enc:
        before = enc.memory
        assert before["weights"] > 0 and before["workspace"] == 0
        enc.forward(np.array([5, 6, 7], dtype=np.int32), np.array([0, 3], dtype=np.int32))
        assert enc.memory["workspace"] > 0


def test_stats_count_forwards():
    import numpy as np
    with nopad.Encoder(os.path.join(REPO, "tests", "data", "models", "bert_a")) as enc:
        assert enc.stats == {"forwards": 0, "graph_replays": 0, "graphs_recorded": 0, "graphs_held": 0}
        for _ in range(3):
            enc.forward(np.array([5, 6, 7], dtype=np.int32), np.array([0, 3], dtype=np.int32))
        # the CPU runs ops directly: no graphs
        assert enc.stats == {"forwards": 3, "graph_replays": 0, "graphs_recorded": 0, "graphs_held": 0}
    with pytest.raises(nopad.InvalidArgumentError, match="cuda_graph_max_tokens"):
        nopad.Encoder(os.path.join(REPO, "tests", "data", "models", "bert_a"), cuda_graph_max_tokens=-2)
