"""Tensor parallelism across processes (docs/parallel.md): a model split over several processes.

With no launcher, ``tp_size=N`` is all it takes: the library starts N - 1 worker processes on this
machine (its ``nopad-worker`` program, one GPU each on CUDA) and ends them when the object closes:

>>> with nopad.Generator(path, tp_size=2) as gen:
...     print(gen.generate(prompt, max_tokens=32))

Under a launcher (``mpirun -np N python script.py``, ``srun``; on one machine or several), rank 0
loads the model with ``tp_size=N`` and uses it as usual; every other rank calls :func:`tp_follow`
with the same path and keywords, which runs the steps rank 0 sends until rank 0 closes its model:

>>> if nopad.world_rank() == 0:
...     with nopad.Generator(path, tp_size=nopad.world_size()) as gen:
...         print(gen.generate(prompt, max_tokens=32))
... else:
...     nopad.tp_follow(path, tp_size=nopad.world_size())
"""
from __future__ import annotations

import ctypes
from typing import Optional

from . import _native
from .encoder import PathLike
from .errors import InvalidArgumentError
from .generator import _decoder_params, _model_path_bytes


def world_rank() -> int:
    """This process's rank in its launcher's world (mpirun, srun); 0 without a launcher. Reads
    the launcher's environment: MPI is not started."""
    return int(_native.library().nopad_world_rank())


def world_size() -> int:
    """The number of processes the launcher started (1 without one). MPI is not started."""
    return int(_native.library().nopad_world_size())


def tp_follow(path: PathLike, tp_size: int, device: str = "cpu", dtype: Optional[str] = None,
              threads: int = 0, kv_cache_tokens: Optional[int] = None,
              max_batch_tokens: Optional[int] = None, cuda_graph_max_tokens: int = 0) -> None:
    """On a rank other than 0: loads this rank's shard of the model at `path` and runs the steps
    rank 0 sends, until rank 0 closes its model; then returns. Run under mpirun / srun.

    Pass the path and keywords rank 0 passes to :class:`Generator` or :class:`Encoder` (the
    shards must be cut alike). `dtype` None is fp32 on the CPU and fp16 on CUDA, as for a
    Generator; an Encoder on CUDA defaults to fp32, so name its dtype on every rank. An
    :class:`Engine` is split through the Generator it is given.

    Raises:
        InvalidArgumentError: on rank 0, or a tp_size that is not the launcher's world size.
        NopadError: the shard did not load, or rank 0 failed or vanished (its message).
    """
    _, params = _decoder_params(device, dtype, threads, kv_cache_tokens, max_batch_tokens, tp_size,
                                cuda_graph_max_tokens)
    if params.tp_size == 1:
        raise InvalidArgumentError("tp_follow needs tp_size > 1 (with 1 there is nothing to "
                                   "follow: load the model on this process)")
    raw = _model_path_bytes(path)
    lib = _native.library()
    _native.check(lib.nopad_tp_follow(raw, ctypes.byref(params)))
