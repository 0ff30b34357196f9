"""FAISS GPU path against a fake of faiss's GPU API (no GPU here): the transfer code is real."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from ragserve.store import ChunkWrite, DocumentWrite, Shard
from ragserve.store.gpu import resolve_faiss_device

DIM = 8
rng = np.random.default_rng(3)


class FakeResources:
    pass


class FakeGpuIndex:
    """What index_cpu_to_gpu returns: a copy made at transfer time, searched like a GPU index."""

    def __init__(self, cpu_index):
        self._copy = faiss.clone_index(cpu_index)
        self.searches = 0

    def search(self, query, k):
        self.searches += 1
        return self._copy.search(query, k)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    transfers: list[tuple] = []

    def index_cpu_to_gpu(resources, device, index):
        assert isinstance(resources, FakeResources) and device == 0
        transfers.append((device, index.ntotal))
        return FakeGpuIndex(index)

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1, raising=False)
    monkeypatch.setattr(faiss, "StandardGpuResources", FakeResources, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", index_cpu_to_gpu, raising=False)
    return transfers


def docs(start: int, n: int, meta: dict | None = None) -> list[DocumentWrite]:
    out = []
    for i in range(start, start + n):
        v = rng.normal(size=DIM).astype(np.float32)
        out.append(
            DocumentWrite(
                f"d{i}", f"t{i}", meta or {"i": i}, f"h{i}", [ChunkWrite(f"n{i}", 0, f"c{i}", v / np.linalg.norm(v))]
            )
        )
    return out


def test_device_resolution(monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:
    assert resolve_faiss_device("gpu") == "gpu" and resolve_faiss_device("auto") == "gpu"
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    assert resolve_faiss_device("auto") == "cpu" and resolve_faiss_device("cpu") == "cpu"
    with pytest.raises(RuntimeError, match="faiss-gpu"):
        resolve_faiss_device("gpu")
    with pytest.raises(ValueError):
        resolve_faiss_device("tpu")


def test_gpu_mirror_follows_mutations_and_matches_cpu(tmp_path: Path, fake_gpu) -> None:
    gpu = Shard(tmp_path / "g", faiss_device="gpu")
    cpu = Shard(tmp_path / "c", faiss_device="cpu")
    batch = docs(0, 30)
    for s in (gpu, cpu):
        s.upsert_documents("ix", batch)
    q = batch[4].chunks[0].vector
    hits = lambda s: [(h.doc_id, round(h.score, 5)) for h in s.search("ix", q, 5)]  # noqa: E731
    assert hits(gpu) == hits(cpu)
    assert hits(gpu) == hits(cpu)
    assert fake_gpu == [(0, 30)]  # copied once; searched twice
    for s in (gpu, cpu):
        s.upsert_documents("ix", docs(30, 5))
        s.delete_documents("ix", ["d4"])
    assert hits(gpu) == hits(cpu) and fake_gpu[-1] == (0, 34)  # re-copied after the changes
    filtered = gpu.search("ix", q, 3, {"i": 7})  # selectors run on the CPU index
    assert [h.doc_id for h in filtered] == ["d7"] and len(fake_gpu) == 2
    gpu.drop_index("ix")
    assert gpu._mirror._gpu is not None and gpu._mirror._gpu._copies == {}
