"""FAISS on the GPU (faiss-gpu), chosen by ``Settings.faiss_device``.

The CPU index stays the master copy: it takes every add and remove (GPU flat indexes cannot remove
ids) and is what snapshots save. The GPU holds a search mirror, copied again after the index
changed, on the first search that needs it. Filtered searches use the CPU index, because id
selectors are a CPU feature.
"""

from __future__ import annotations

import threading
from typing import Any

import faiss
import numpy as np


def gpu_count() -> int:
    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None and hasattr(faiss, "StandardGpuResources") else 0


def resolve_faiss_device(setting: str) -> str:
    """``cpu``/``gpu``/``auto`` → the device to use; ``gpu`` without a GPU build or device is an error."""
    if setting == "cpu":
        return "cpu"
    if setting == "auto":
        return "gpu" if gpu_count() > 0 else "cpu"
    if setting == "gpu":
        if gpu_count() == 0:
            raise RuntimeError(
                "faiss_device 'gpu' needs faiss-gpu and a visible CUDA device; "
                "install the gpu extra or set faiss_device to 'cpu' or 'auto'"
            )
        return "gpu"
    raise ValueError(f"faiss_device must be cpu, gpu or auto, not {setting!r}")


class GpuMirror:
    """Per-index GPU copies of CPU indexes, refreshed when the index's version moves on."""

    def __init__(self, device_id: int = 0):
        self.device_id = device_id
        self._resources = faiss.StandardGpuResources()
        self._copies: dict[str, tuple[int, Any]] = {}
        self._lock = threading.Lock()
        self.transfers = 0

    def search(self, name: str, cpu_index: Any, version: int, query: np.ndarray, k: int) -> tuple[Any, Any]:
        with self._lock:
            held = self._copies.get(name)
            if held is None or held[0] != version:
                held = (version, faiss.index_cpu_to_gpu(self._resources, self.device_id, cpu_index))
                self._copies[name] = held
                self.transfers += 1
        return held[1].search(query, k)

    def drop(self, name: str) -> None:
        with self._lock:
            self._copies.pop(name, None)
