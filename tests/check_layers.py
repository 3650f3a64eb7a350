#!/usr/bin/env python3
"""The layering rule of docs/ARCHITECTURE.md, checked on every project #include.

Each file's layer is its folder; a file may include its own layer and the layers below it:

    tools/cli/         the public header (nopad.h) and the programs' CPU settings (tools/cpu_settings.h)
    tools/worker/      the same (nopad-worker)
    tools/serve/       the public header and the CLI's helpers (tools/cli/cli.h)
    src/engine/        model/, parallel/, backend/backend.h, io/, util/
    src/train/         model/, parallel/, backend/backend.h, io/, util/
    src/model/         parallel/, backend/backend.h, io/, util/
    src/parallel/      backend/backend.h, util/
    src/backend/       backend/ (a backend's own folder and the op table), util/
    src/io/            io/, util/
    src/util/          util/
    tests/, fuzz/, tools/gemm_bench.c: anything (they test or time the internals)

Exits 1 naming every include that breaks the rule."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# (folder prefix, includes allowed by prefix); the first matching folder decides
RULES = [
    ("tools/cli/", ["nopad.h", "tools/cli/", "tools/cpu_settings.h"]),
    ("tools/worker/", ["nopad.h", "tools/worker/", "tools/cpu_settings.h"]),
    ("tools/cpu_settings.h", ["nopad.h"]),
    ("tools/serve/", ["nopad.h", "tools/serve/", "tools/cli/cli.h"]),
    ("src/engine/", ["nopad.h", "engine/", "grammar/", "model/", "parallel/", "backend/backend.h", "io/", "util/"]),
    ("src/train/", ["nopad.h", "train/", "model/", "parallel/", "backend/backend.h", "io/", "util/"]),
    ("src/model/", ["nopad.h", "model/", "parallel/", "backend/backend.h", "io/", "util/"]),
    ("src/parallel/", ["nopad.h", "parallel/", "backend/backend.h", "util/"]),
    ("src/backend/cuda/", ["nopad.h", "backend/backend.h", "backend/cuda/", "util/"]),
    ("src/backend/cpu/", ["nopad.h", "backend/backend.h", "backend/cpu/", "util/"]),
    ("src/backend/", ["nopad.h", "backend/", "util/"]),
    ("src/grammar/", ["nopad.h", "grammar/", "io/", "util/"]),
    ("src/io/", ["nopad.h", "io/", "util/"]),
    ("src/util/", ["nopad.h", "util/"]),
]


# the folders of src/ (and the CLI's), as includes name them
PROJECT = {p.name for p in (ROOT / "src").iterdir() if p.is_dir()} | {"tools"}


def resolve(src: pathlib.Path, name: str) -> str:
    """The include as a path under src/ (or tools/cli/ for the CLI's own headers)."""
    rel = src.relative_to(ROOT).as_posix()
    if name.startswith("../") and rel.startswith("tools/"):  # "../cpu_settings.h" from tools/cli/
        return (src.parent / name).resolve().relative_to(ROOT).as_posix()
    if "/" not in name and (src.parent / name).exists():  # "cli.h" next to the file
        return (src.parent / name).relative_to(ROOT).as_posix() if rel.startswith("tools/") else \
            (src.parent / name).relative_to(ROOT / "src").as_posix()
    return name


def main() -> int:
    bad = []
    files = [p for p in ROOT.glob("src/**/*") if p.suffix in (".c", ".h", ".cu", ".cuh")]
    files += [p for p in ROOT.glob("tools/cli/*") if p.suffix in (".c", ".h")]
    files += [p for p in ROOT.glob("tools/worker/*") if p.suffix in (".c", ".h")]
    files += [ROOT / "tools" / "cpu_settings.h"]
    files += [p for p in ROOT.glob("tools/serve/*") if p.suffix in (".c", ".h")]
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        allowed = next(a for prefix, a in RULES if rel.startswith(prefix))
        for name in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            target = resolve(path, name)
            if target.split("/")[0] not in PROJECT and target != "nopad.h":
                continue  # a library's header (cutlass/..., cute/...)
            if not any(target == a or target.startswith(a) for a in allowed):
                bad.append("%s includes \"%s\": its layer may include %s" % (rel, name, ", ".join(allowed)))
    for line in bad:
        print(line)
    print("%d files checked, %d includes break the layering" % (len(files), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
