"""In-tree PEP 517 build backend of the nopad Python package (no build dependencies; the build
itself uses no network, while pip fetches the runtime dependency numpy from PyPI when missing).

build_wheel builds libnopad.so with CMake from the repository this folder sits in (target
nopad_shared, in <repo>/build-python/ unless $NOPAD_BUILD_DIR says otherwise; options from
$NOPAD_CMAKE_ARGS), or takes $NOPAD_LIBRARY as it is, and writes a wheel holding the nopad
package with the library at nopad/_lib/libnopad.so and nopad-worker beside it (target
nopad_worker: the processes that tp_size > 1 starts without a launcher). build_editable (pip
install -e ./python) puts both in python/nopad/_lib/ and a .pth file pointing at python/.

Metadata comes from pyproject.toml's [project] table. Progress ([1/3] configuring, [2/3]
compiling, [3/3] bundling) goes to stderr, and to the terminal too when pip hides stderr.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
PKG_ROOT = HERE.parent           # python/
REPO = PKG_ROOT.parent           # the repository
LIB_NAME = "libnopad.so"
WORKER_NAME = "nopad-worker"

__all__ = ["build_wheel", "build_editable", "build_sdist", "get_requires_for_build_wheel",
           "get_requires_for_build_editable", "get_requires_for_build_sdist",
           "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable"]


def _terminal():
    """The controlling terminal when stderr is not one, else None. pip captures a backend's
    output and shows it only with -v or after a failure: progress written there alone would
    leave `pip install ./python` silent for the minute CMake takes. NOPAD_BUILD_QUIET=1 (or no
    terminal, as in CI) keeps it to stderr."""
    if os.environ.get("NOPAD_BUILD_QUIET") or sys.stderr.isatty():
        return None
    try:
        return open("/dev/tty", "w")
    except OSError:
        return None


_TTY = _terminal()


def _log(msg: str) -> None:
    """A progress line: on stderr (pip -v shows it), and on the terminal when pip hides it."""
    line = "nopad build: " + msg
    print(line, file=sys.stderr, flush=True)
    if _TTY is not None:
        try:
            _TTY.write("\n" + line)
            _TTY.flush()
        except OSError:
            pass


# ---- pyproject.toml --------------------------------------------------------------------------


def _parse_toml_subset(text: str) -> dict:
    """Enough TOML for our pyproject.toml (tables, strings, one-line string arrays), for Pythons
    without tomllib."""
    data: dict = {}
    table = data
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line)
        if m:
            table = data
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*(.+)', line)
        if not m:
            raise ValueError("pyproject.toml: cannot read line %r" % raw)
        key, value = m.group(1), m.group(2).strip()
        if value.startswith("["):
            table[key] = re.findall(r'"((?:[^"\\]|\\.)*)"', value)
        elif value.startswith('"'):
            table[key] = re.fullmatch(r'"((?:[^"\\]|\\.)*)"\s*(#.*)?', value).group(1)
        else:
            raise ValueError("pyproject.toml: unsupported value in %r" % raw)
    return data


def _project() -> dict:
    text = (PKG_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib  # Python >= 3.11
        return tomllib.loads(text)["project"]
    except ImportError:
        return _parse_toml_subset(text)["project"]


def _metadata() -> Tuple[str, str, str]:
    """(name, version, METADATA text)."""
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"],
             "Summary: %s" % p.get("description", "")]
    if "requires-python" in p:
        lines.append("Requires-Python: %s" % p["requires-python"])
    for dep in p.get("dependencies", []):
        lines.append("Requires-Dist: %s" % dep)
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: %s" % extra)
        for dep in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
    body = ""
    readme = p.get("readme")
    if readme and (PKG_ROOT / readme).is_file():
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + (PKG_ROOT / readme).read_text(encoding="utf-8")
    return p["name"], p["version"], "\n".join(lines) + "\n" + body


def _tag() -> str:
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-%s" % plat  # pure Python, but carries a native library


def _dist_info_files(name: str, version: str, metadata: str) -> Dict[str, bytes]:
    wheel = ("Wheel-Version: 1.0\nGenerator: nopad_build\nRoot-Is-Purelib: false\nTag: %s\n"
             % _tag())
    return {"METADATA": metadata.encode(), "WHEEL": wheel.encode(),
            "top_level.txt": b"nopad\n"}


# ---- the library -----------------------------------------------------------------------------


def _run(cmd: List[str]) -> None:
    """Runs cmd, passing its output on line by line as it comes (pip -v shows the compile
    progressing); a failure raises with the output's last lines."""
    print("nopad build: $ " + " ".join(shlex.quote(str(c)) for c in cmd), file=sys.stderr,
          flush=True)
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    tail: List[str] = []
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        sys.stderr.write(line)
        sys.stderr.flush()
        tail = (tail + [line.rstrip("\n")])[-30:]
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError("nopad build: command failed (exit %d): %s\n%s\nThe library needs "
                           "CMake, a C compiler, cJSON, utf8proc, PCRE2 and OpenBLAS (Debian: "
                           "scripts/install_deps.sh), or set NOPAD_LIBRARY to a built "
                           "libnopad.so." % (proc.returncode, " ".join(map(str, cmd)),
                                             "\n".join(tail)))


def _library() -> Path:
    """libnopad.so to bundle: $NOPAD_LIBRARY, else built with CMake from the repository."""
    env = os.environ.get("NOPAD_LIBRARY")
    if env:
        path = Path(env).resolve()
        if not path.is_file():
            raise RuntimeError("nopad build: NOPAD_LIBRARY=%s: no such file" % env)
        _log("taking %s from NOPAD_LIBRARY (no CMake build)" % path)
        return path
    if not (REPO / "CMakeLists.txt").is_file() or not (REPO / "include" / "nopad.h").is_file():
        raise RuntimeError(
            "nopad build: %s is not inside the nopad repository, so libnopad.so cannot be "
            "built; install from a checkout (pip install ./python, pip >= 21.3 builds in place) "
            "or set NOPAD_LIBRARY to a built libnopad.so" % PKG_ROOT)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("nopad build: cmake not found; install it (scripts/install_deps.sh) "
                           "or set NOPAD_LIBRARY to a built libnopad.so")
    build = Path(os.environ.get("NOPAD_BUILD_DIR") or REPO / "build-python")
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DNOPAD_BUILD_TESTS=OFF", "-DNOPAD_SANITIZE=OFF",
            "-DNOPAD_FUZZ=OFF", "-DNOPAD_CUDA=OFF"]
    args += shlex.split(os.environ.get("NOPAD_CMAKE_ARGS", ""))
    jobs = os.cpu_count() or 2
    started = time.monotonic()
    _log("[1/3] configuring libnopad.so with CMake in %s" % build)
    _run([cmake, "-S", REPO, "-B", build] + args)
    _log("[2/3] compiling libnopad.so with %d jobs (about a minute on 2 cores the first time; "
         "pip install -v shows the compiler's progress)" % jobs)
    _run([cmake, "--build", build, "--target", "nopad_shared", "nopad_worker", "-j", str(jobs)])
    lib = build / LIB_NAME
    if not lib.is_file():
        raise RuntimeError("nopad build: CMake finished but %s is missing" % lib)
    _log("libnopad.so built in %.0f s" % (time.monotonic() - started))
    return lib


# ---- wheels ----------------------------------------------------------------------------------


def _package_files() -> List[Tuple[str, Path]]:
    """(archive name, source path) of the package's Python files."""
    files = []
    for path in sorted((PKG_ROOT / "nopad").rglob("*")):
        rel = path.relative_to(PKG_ROOT)
        if path.is_file() and "__pycache__" not in rel.parts and rel.parts[1:2] != ("_lib",) \
                and path.suffix in (".py", ".typed"):
            files.append((rel.as_posix(), path))
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _write_wheel(directory: str, entries: List[Tuple[str, bytes, int]]) -> str:
    name, version, metadata = _metadata()
    dist_info = "%s-%s.dist-info" % (name, version)
    for fname, data in _dist_info_files(name, version, metadata).items():
        entries.append(("%s/%s" % (dist_info, fname), data, 0o644))
    filename = "%s-%s-%s.whl" % (name, version, _tag())
    record = [_record_line(n, d) for n, d, _ in entries] + ["%s/RECORD,," % dist_info]
    entries.append(("%s/RECORD" % dist_info, ("\n".join(record) + "\n").encode(), 0o644))
    os.makedirs(directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data, mode in entries:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    _log("wrote %s; pip installs it next (and numpy from PyPI when it is missing)" % filename)
    return filename


def _worker(lib: Path) -> Optional[Path]:
    """nopad-worker beside `lib` (the processes tp_size > 1 starts without a launcher), or None."""
    worker = lib.parent / WORKER_NAME
    if worker.is_file():
        return worker
    _log("no %s beside %s: the package will refuse tp_size > 1 without a launcher (mpirun "
         "still works)" % (WORKER_NAME, lib))
    return None


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    lib = _library()
    _log("[3/3] bundling %s and the nopad package into a wheel" % lib)
    entries = [(n, p.read_bytes(), 0o644) for n, p in _package_files()]
    entries.append(("nopad/_lib/" + LIB_NAME, lib.read_bytes(), 0o755))
    worker = _worker(lib)
    if worker is not None:
        entries.append(("nopad/_lib/" + WORKER_NAME, worker.read_bytes(), 0o755))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None,
                   metadata_directory: Optional[str] = None) -> str:
    lib = _library()
    dest = PKG_ROOT / "nopad" / "_lib" / LIB_NAME
    _log("[3/3] copying %s to %s (editable install)" % (lib, dest))
    dest.parent.mkdir(exist_ok=True)
    worker = _worker(lib)
    for src, dst in ((lib, dest), (worker, dest.parent / WORKER_NAME)):
        if src is None:
            continue
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)  # a new inode: a process that has the old one loaded keeps it
    entries = [("nopad_editable.pth", (str(PKG_ROOT) + "\n").encode(), 0o644)]
    return _write_wheel(wheel_directory, entries)


def _prepare_metadata(metadata_directory: str) -> str:
    name, version, metadata = _metadata()
    dist_info = Path(metadata_directory) / ("%s-%s.dist-info" % (name, version))
    dist_info.mkdir(parents=True, exist_ok=True)
    for fname, data in _dist_info_files(name, version, metadata).items():
        (dist_info / fname).write_bytes(data)
    return dist_info.name


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[dict] = None) -> str:
    return _prepare_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory: str,
                                        config_settings: Optional[dict] = None) -> str:
    return _prepare_metadata(metadata_directory)


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    raise RuntimeError("nopad build: no source distribution; the package builds libnopad.so from "
                       "the repository: pip install ./python (or python -m build --wheel python)")
