"""The Ingestion deployment's seam, at the library boundary: the ingress's proxies
(``remote_ingestion``) calling the deployment's own ``call`` method through a stand-in for its Ray
handle that does what Ray does to a call (arguments and results pickled across a process, an
exception wrapped in an error whose ``cause`` is the original). The whole OpenAI flow runs through
it over real HTTP with the SDK: uploads written by the "ingress" on the shared storage and
committed by the "owner", attach and poll, search, errors still the right 4xx."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragserve.config import Settings
from ragserve.deployments.ingestion import Ingestion, check_call, remote_ingestion, served_methods
from ragserve.http import create_app
from ragserve.service.file_store import FileStore
from ragserve.service.limits import RequestLimits
from ragserve.service.local import EngineClient
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.service.wiring import build_documents, build_ingestion, build_services
from ragserve.testing.live import serve


class RayTaskErrorLike(Exception):
    """How an exception raised in a deployment reaches the caller: wrapped, the original as ``cause``."""

    def __init__(self, cause: BaseException):
        super().__init__(repr(cause))
        self.cause = cause


class StandInHandle:
    """``handle.call.remote(...)`` as Ray runs it: on the deployment, with everything pickled."""

    def __init__(self, replica: Any):
        self.replica = replica
        self.calls: list[tuple[str, str]] = []
        self._started = False

    @property
    def call(self) -> StandInHandle:
        return self

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        if not self._started:  # the replica's constructor starts its runner, in its own loop
            self._started = True
            await self.replica.core.start()
        args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
        self.calls.append((args[0], args[1]))
        try:
            result = await self.replica.call(*args, **kwargs)
        except Exception as e:
            raise RayTaskErrorLike(pickle.loads(pickle.dumps(e))) from None
        return pickle.loads(pickle.dumps(result))


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, embedding_model: Any) -> Iterator[tuple[str, StandInHandle]]:
    from ragserve.models.openai_engine import OpenAIEngine
    from ragserve.testing.embedder import InProcessEmbedder

    storage = tmp_path_factory.mktemp("ingestion")
    s = Settings(storage_dir=str(storage), llm_engine="openai", llm_url="http://127.0.0.1:9/v1", num_shards=2)
    check_layout(s.storage_dir, s.num_shards)
    pool = LocalShardPool([ShardService(s.storage_dir, i, s.num_shards) for i in range(s.num_shards)])
    embedder = InProcessEmbedder(embedding_model)
    tokenizer = embedding_model.tokenizer
    # the owner: the deployment's class with its core built as its constructor builds it
    replica = object.__new__(Ingestion.func_or_class)
    owner_docs = build_documents(
        s, pool=pool, embedder=embedder, embedding_model="all-MiniLM-L6-v2", embedding_tokenizer=tokenizer
    )
    replica.core = build_ingestion(s, owner_docs, RequestLimits.from_settings(s))
    handle = StandInHandle(replica)
    services = build_services(
        s,
        pool=pool,
        embedder=embedder,
        llm=EngineClient(OpenAIEngine(str(s.llm_url), "fake-model", None, 5.0)),
        embedding_model="all-MiniLM-L6-v2",
        embedding_tokenizer=tokenizer,
        ingestion=remote_ingestion(handle, s),
    )
    assert services.ingestion.runner is None  # the ingress runs no jobs
    try:
        with serve(create_app(services)) as url:
            yield url, handle
    finally:
        services.close()
        pool.close()


def test_the_openai_flow_runs_through_the_deployment_seam(app: tuple[str, StandInHandle]) -> None:
    from openai import BadRequestError, NotFoundError, OpenAI

    url, handle = app
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    f = client.files.create(
        file=("refunds.md", io.BytesIO(b"# Refunds\n\nPaid back within 14 days.\n")), purpose="assistants"
    )
    assert client.files.content(f.id).read() == b"# Refunds\n\nPaid back within 14 days.\n"  # read by the ingress
    store = client.vector_stores.create(name="seam")
    done = client.vector_stores.files.create_and_poll(file_id=f.id, vector_store_id=store.id)
    assert done.status == "completed", done
    hit = client.vector_stores.search(store.id, query="when is a refund paid").data[0]
    assert hit.file_id == f.id and "14 days" in hit.content[0].text
    with pytest.raises(NotFoundError):  # a ServiceError raised in the owner is the same 404 here
        client.vector_stores.retrieve("vs_missing")
    with pytest.raises(BadRequestError):
        client.vector_stores.search(store.id, query="x", filters={"type": "or", "filters": []})
    client.files.delete(f.id)
    assert client.vector_stores.retrieve(store.id).file_counts.total == 0
    # what crossed: records of files through the owner, the bytes never
    assert ("files", "commit") in handle.calls and ("vector_stores", "create") in handle.calls
    assert not any(m in ("stage", "stream", "read") for _, m in handle.calls)


def test_only_public_coroutine_methods_are_called_by_name() -> None:
    assert {"get", "commit", "list", "delete"} <= served_methods(FileStore)
    for target, method in [("files", "close"), ("files", "_get"), ("files", "sweep"), ("jobs", "store"), ("x", "get")]:
        with pytest.raises(ValueError):
            check_call(target, method)


def test_the_shared_store_writes_bytes_where_the_owner_commits_them(tmp_path: Path) -> None:
    import asyncio

    from ragserve.service.file_store import SharedFileStore

    owner = FileStore(tmp_path, 1024)

    async def records(method: str, *args: Any) -> Any:
        return await getattr(owner, method)(*pickle.loads(pickle.dumps(args)))

    shared = SharedFileStore(tmp_path, 1024, records)

    async def flow() -> None:
        rec = await shared.put("a.txt", "assistants", io.BytesIO(b"hello"))
        assert (await owner.get(rec.id)).bytes == 5 and await shared.read(rec.id) == b"hello"
        await shared.delete(rec.id)
        assert not (tmp_path / "blobs" / rec.id).exists()

    asyncio.run(flow())
    owner.close()
