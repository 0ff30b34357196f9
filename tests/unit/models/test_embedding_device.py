"""``embedding_device``: where the Embedder runs its model. ``cuda`` on a machine whose torch sees no
GPU stops the Embedder with a message saying so, instead of running on the CPU unnoticed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ragserve.config import Settings


def test_the_setting_takes_auto_cpu_or_cuda() -> None:
    assert Settings().embedding_device == "auto"
    assert Settings(embedding_device="cuda").embedding_device == "cuda"
    with pytest.raises(ValidationError, match="embedding_device"):
        Settings(embedding_device="gpu")


def test_cuda_without_a_gpu_is_refused_before_the_model_loads() -> None:
    import torch

    from ragserve.models.embeddings import LocalEmbeddingModel

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(
        RuntimeError, match=r"cannot run on cuda: torch .* sees no GPU.*embedding_device to auto or cpu"
    ):
        LocalEmbeddingModel(None, device="cuda")


def test_the_embedder_deployment_runs_the_model_where_the_setting_says(monkeypatch: pytest.MonkeyPatch) -> None:
    import ragserve.deployments.embedder as embedder_mod

    devices: list[str | None] = []

    class Refused(Exception):
        pass

    def record(model: str | None, device: str | None = None, threads: int | None = None) -> None:
        devices.append(device)
        raise Refused  # the rest of the Embedder's start is not what this test is about

    monkeypatch.setattr(embedder_mod, "LocalEmbeddingModel", record)
    for setting in ("auto", "cpu", "cuda"):
        with pytest.raises(Refused):
            embedder_mod.Embedder.func_or_class(Settings(embedding_device=setting))
    assert devices == [None, "cpu", "cuda"]
