"""Randomized concurrent histories against a reference model (seeded, so a failure replays).

Each step runs a group of operations at once (asyncio over ``LocalShardPool``, so every shard call
runs in its own worker thread) against the real ``DocumentService`` and shards: index, update and
delete documents, identical id-less adds, several updates of one document, a delete-index racing a
write, persist (some to paths that collide with another snapshot), load (some from a damaged
snapshot). After each step the shards' self-check must pass and every index's documents and search
results must equal the model's. Operations within a group are chosen so that the model can tell
every valid outcome: either they commute, or the test accepts exactly the outcomes a linearizable
store may produce (one of the concurrent updates wins; a write racing a drop is dropped with it,
refused, or lands in the index created after the drop).

The embedder is a deterministic fake (a vector from a hash of the text) so that expected search
results are exact; the chunker is the real one with a word counter, and every text is one chunk.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import random
import shutil
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragserve.api.documents import Document, UpdateDocument
from ragserve.errors import BadRequestError, ConflictError, NotFoundError
from ragserve.ingest import DocumentChunker, content_hash
from ragserve.service.documents import DocumentService, content_doc_id
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout

DIM = 24
STEPS = 50
INDEXES = ["alpha", "beta", "gamma"]
PATHS = [None, "p1", "p1/q", "alpha", "p2"]

Docs = dict[str, tuple[str, dict[str, Any]]]  # doc_id -> (text, metadata)


def vector(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    v = np.random.default_rng(seed).normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


async def later(op: Awaitable[Any], delay: float) -> Any:
    """``op`` after ``delay`` seconds: moves a racing operation over the other one's stages."""
    await asyncio.sleep(delay)
    return await op


class HashEmbedder:
    """Same text, same vector; different texts, nearly orthogonal ones."""

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        return np.stack([vector(t) for t in texts])

    async def embed_query(self, text: str) -> np.ndarray:
        return vector(text)


class History:
    """The seeded generator and the reference model it keeps."""

    def __init__(self, seed: int, svc: DocumentService, storage: Path):
        self.rng = random.Random(seed)
        self.svc = svc
        self.storage = storage
        self.model: dict[str, Docs] = {}
        self.snapshots: dict[str, Docs] = {}  # snapshot dir (relative to snapshots/) -> content
        self.counter = 0
        self.seen: collections.Counter[str] = collections.Counter()  # outcomes met, for the record

    # --- generators ---------------------------------------------------------------------------
    def text(self, kind: str) -> str:
        self.counter += 1
        return f"{kind} {self.rng.randrange(6)} revision {self.counter} of the notes"

    def meta(self) -> dict[str, Any]:
        return {"g": self.rng.choice("ab"), "n": self.rng.randrange(3)}

    def fresh_id(self) -> str:
        self.counter += 1
        return f"d{self.counter}"

    def auto_id(self, index: str, text: str, meta: dict[str, Any]) -> str | None:
        """The id an id-less add gets in the model, or None when that content is already stored."""
        docs = self.model.get(index, {})
        h = content_hash(text, meta)
        if any(content_hash(t, m) == h for t, m in docs.values()):
            return None
        attempt = 0
        while content_doc_id(h, attempt) in docs:
            attempt += 1
        return content_doc_id(h, attempt)

    # --- one step -----------------------------------------------------------------------------
    async def step(self) -> None:
        existing = [ix for ix in INDEXES if self.model.get(ix)]
        kinds = ["writes"] * 4 + (["same_doc", "drop_race", "drop", "persist", "load", "load_race"] if existing else [])
        kind = self.rng.choice(kinds)
        self.seen[kind] += 1
        await getattr(self, kind)(existing)

    def _write_ops(self, exclude: set[str]) -> tuple[list[Awaitable[Any]], list[Any]]:
        """Concurrent writes on disjoint documents of indexes not in ``exclude``: they commute."""
        ops: list[Awaitable[Any]] = []
        effects: list[Any] = []
        touched: set[tuple[str, str]] = set()
        for _ in range(self.rng.randint(1, 4)):
            index = self.rng.choice([ix for ix in INDEXES if ix not in exclude] or INDEXES)
            if index in exclude:
                break
            docs = self.model.get(index, {})
            free = [d for d in docs if (index, d) not in touched]
            op = self.rng.choice(["add", "add", "auto", "update", "delete"] if free else ["add", "auto"])
            if op == "add":
                new = [(self.fresh_id(), self.text("doc"), self.meta()) for _ in range(self.rng.randint(1, 3))]
                ops.append(self.svc.add_documents(index, [Document(text=t, metadata=m, doc_id=i) for i, t, m in new]))
                effects.append(("set", index, new))
            elif op == "auto":
                pick = [docs[d] for d in free if docs[d][0].startswith("auto")]
                text, meta = self.rng.choice(pick) if pick and self.rng.random() < 0.5 else (self.text("auto"), {})
                # every id this add may take or find must stay out of the group's other operations
                h = content_hash(text, meta)
                chain = [content_doc_id(h, 0)]
                while chain[-1] in docs:
                    chain.append(content_doc_id(h, len(chain)))
                chain += [d for d, (t, m) in docs.items() if content_hash(t, m) == h]
                if any((index, d) in touched for d in chain):
                    continue
                touched.update((index, d) for d in chain)
                copies = self.rng.randint(1, 2)
                for _ in range(copies):  # identical id-less adds at once store one document
                    ops.append(self.svc.add_documents(index, [Document(text=text, metadata=meta)]))
                effects.append(("auto", index, text, meta, copies))
            elif op == "update":
                doc_id = self.rng.choice(free)
                text, meta = self.text("doc"), self.rng.choice([None, self.meta()])
                ops.append(self.svc.update_documents(index, [UpdateDocument(doc_id=doc_id, text=text, metadata=meta)]))
                effects.append(("update", index, doc_id, text, meta))
                touched.add((index, doc_id))
            else:
                gone = self.rng.sample(free, min(len(free), self.rng.randint(1, 2)))
                ops.append(self.svc.delete_documents(index, [*gone, "never-there"]))
                effects.append(("delete", index, gone))
                touched.update((index, d) for d in gone)
        return ops, effects

    def _apply(self, effects: list[Any], results: list[Any]) -> None:
        at = 0
        for effect in effects:
            if effect[0] == "set":
                _, index, new = effect
                assert [r.doc_id for r in results[at]] == [i for i, _, _ in new]
                self.model.setdefault(index, {}).update({i: (t, m) for i, t, m in new})
                at += 1
            elif effect[0] == "auto":
                _, index, text, meta, copies = effect
                expected = self.auto_id(index, text, meta)
                ids = {r[0].doc_id for r in results[at : at + copies]}
                assert len(ids) == 1, f"identical concurrent adds stored {len(ids)} documents"
                self.seen["identical adds at once" if copies > 1 else "id-less add"] += 1
                if expected is not None:
                    assert ids == {expected}
                    self.model.setdefault(index, {})[expected] = (text, meta)
                at += copies
            elif effect[0] == "update":
                _, index, doc_id, text, meta = effect
                old_meta = self.model[index][doc_id][1]
                self.model[index][doc_id] = (text, old_meta if meta is None else meta)
                assert [d.doc_id for d in results[at].updated_documents] == [doc_id]
                at += 1
            else:
                _, index, gone = effect
                assert sorted(results[at].deleted_doc_ids) == sorted(gone)
                assert results[at].not_found_doc_ids == ["never-there"]
                for d in gone:
                    del self.model[index][d]
                at += 1

    async def writes(self, existing: list[str], exclude: frozenset[str] = frozenset()) -> None:
        ops, effects = self._write_ops(set(exclude))
        self._apply(effects, list(await asyncio.gather(*ops)))

    async def same_doc(self, existing: list[str]) -> None:
        """Several updates of one document at once: one of them wins, whole, and no ghost vectors."""
        index = self.rng.choice(existing)
        doc_id = self.rng.choice(sorted(self.model[index]))
        candidates = [(self.text("doc"), self.meta()) for _ in range(self.rng.randint(2, 3))]
        await asyncio.gather(
            *(
                self.svc.update_documents(index, [UpdateDocument(doc_id=doc_id, text=t, metadata=m)])
                for t, m in candidates
            )
        )
        stored = (await self.svc._get_documents(index, [doc_id]))[doc_id]
        assert (stored.text, stored.metadata) in candidates
        self.model[index][doc_id] = (stored.text, stored.metadata)

    async def drop_race(self, existing: list[str]) -> None:
        """A delete-index racing a write to it: the write is dropped with the index, refused (409)
        storing nothing, or lands in the index created after the drop, alone."""
        index = self.rng.choice(existing)
        new = [(self.fresh_id(), self.text("doc"), self.meta()) for _ in range(self.rng.randint(1, 3))]
        dropped, written = await asyncio.gather(
            later(self.svc.drop_index(index), self.rng.random() * 0.02),
            self.svc.add_documents(index, [Document(text=t, metadata=m, doc_id=i) for i, t, m in new]),
            return_exceptions=True,
        )
        assert not isinstance(dropped, BaseException), dropped
        assert not isinstance(written, BaseException) or isinstance(written, ConflictError), written
        self.model.pop(index)
        if await self.svc.index_exists(index):
            assert not isinstance(written, BaseException), "a refused write left an index behind"
            self.model[index] = {i: (t, m) for i, t, m in new}
            self.seen["write after the drop"] += 1
        else:
            self.seen["write refused" if isinstance(written, BaseException) else "write dropped with the index"] += 1

    async def drop(self, existing: list[str]) -> None:
        """A delete-index with writes to other indexes and reads of this one at once: the reads
        answer (before the drop) or 404 (after), never fail otherwise."""
        index = self.rng.choice(existing)
        doc_id = self.rng.choice(sorted(self.model[index]))
        results = await asyncio.gather(
            later(self.svc.drop_index(index), self.rng.random() * 0.005),
            self.writes(existing, exclude=frozenset({index})),
            self.svc.retrieve(index, self.model[index][doc_id][0], 3, mode="dense"),
            self.svc.list_documents(index, limit=5),
            self.svc.delete_documents(index, ["never-there"]),
            return_exceptions=True,
        )
        for r in results[:2]:
            if isinstance(r, BaseException):
                raise r
        for r in results[2:]:
            assert not isinstance(r, BaseException) or isinstance(r, NotFoundError), repr(r)
        self.model.pop(index)

    def _collides(self, dest: str) -> bool:
        return any(s != dest and (s.startswith(dest + "/") or dest.startswith(s + "/")) for s in self.snapshots)

    async def persist(self, existing: list[str]) -> None:
        index = self.rng.choice(existing)
        path = self.rng.choice(PATHS)
        dest = f"{path}/{index}" if path else index
        persisted, wrote = await asyncio.gather(
            self.svc.persist(index, path), self.writes(existing, exclude=frozenset({index})), return_exceptions=True
        )
        if isinstance(wrote, BaseException):
            raise wrote
        if self._collides(dest):
            assert isinstance(persisted, BadRequestError), persisted
            self.seen["nested snapshot refused"] += 1
        else:
            assert persisted == f"Successfully persisted index {index} to {dest}.", persisted
            self.snapshots[dest] = dict(self.model[index])

    async def load(self, existing: list[str]) -> None:
        if not self.snapshots:
            return await self.persist(existing)
        src = self.rng.choice(sorted(self.snapshots))
        name = self.rng.choice(INDEXES)
        overwrite = self.rng.random() < 0.6
        damaged = self.rng.random() < 0.25
        path = src
        if damaged:  # a copy with a truncated part: the load must fail and change nothing
            root = self.storage / "snapshots"
            path = f"damaged/{self.counter}"
            shutil.copytree(root / src, root / path)
            manifest = json.loads((root / path / "manifest.json").read_text())
            if not manifest["parts"]:
                return None
            part = root / path / manifest["parts"][0]
            part.write_bytes(part.read_bytes()[:200])
        loaded, wrote = await asyncio.gather(
            self.svc.load(name, path, overwrite),
            self.writes(existing, exclude=frozenset({name})),
            return_exceptions=True,
        )
        if isinstance(wrote, BaseException):
            raise wrote
        self.seen["damaged load" if damaged else "load"] += 1
        if name in self.model and not overwrite:
            assert isinstance(loaded, ConflictError), loaded
        elif damaged:
            assert isinstance(loaded, BadRequestError), loaded
        else:
            assert loaded == f"Successfully loaded index {name} from {path}.", loaded
            self.model[name] = dict(self.snapshots[src])
        return None

    async def load_race(self, existing: list[str]) -> None:
        """A load over an index racing a write to it: the write lands whole after the load, or is
        replaced with the old index, or is refused (409); never in part."""
        if not self.snapshots:
            return await self.persist(existing)
        src = self.rng.choice(sorted(self.snapshots))
        index = self.rng.choice(existing)
        new = [(self.fresh_id(), self.text("doc"), self.meta()) for _ in range(self.rng.randint(2, 4))]
        loaded, written = await asyncio.gather(
            later(self.svc.load(index, src, True), self.rng.random() * 0.005),
            later(
                self.svc.add_documents(index, [Document(text=t, metadata=m, doc_id=i) for i, t, m in new]),
                self.rng.random() * 0.03,
            ),
            return_exceptions=True,
        )
        assert loaded == f"Successfully loaded index {index} from {src}.", loaded
        assert not isinstance(written, BaseException) or isinstance(written, ConflictError), written
        stored = await self.svc._get_documents(index, [i for i, _, _ in new])
        assert len(stored) in (0, len(new)), f"{len(stored)} of {len(new)} documents of a write survived a load"
        assert not stored or not isinstance(written, BaseException), "a refused write left documents"
        self.model[index] = dict(self.snapshots[src])
        self.model[index].update({i: (t, m) for i, t, m in new if i in stored})
        self.seen["write after the load" if stored else "write replaced or refused by the load"] += 1
        return None

    # --- checks ---------------------------------------------------------------------------------
    async def check(self) -> None:
        assert await self.svc.pool.call_all(ShardService.verify) == [[]] * self.svc.pool.num_shards
        assert await self.svc.list_indexes() == sorted(ix for ix in self.model)
        for index, docs in self.model.items():
            listed: Docs = {}
            for offset in range(0, len(docs) + 1, 100):
                page = await self.svc.list_documents(index, limit=100, offset=offset, max_text_length=None)
                assert page.total_items == len(docs)
                listed.update({d.doc_id: (d.text, d.metadata) for d in page.documents})
            assert listed == docs
            filtered = await self.svc.list_documents(index, limit=100, metadata_filter={"g": "a"})
            assert filtered.total_items == sum(m.get("g") == "a" for _, m in docs.values())
            nodes, _ = await self.svc.retrieve(index, self.text("probe"), len(docs) + 5, mode="dense")
            assert sorted((n.doc_id, n.text) for n in nodes) == sorted((i, t) for i, (t, _) in docs.items())
            if docs:
                doc_id = self.rng.choice(sorted(docs))
                top = (await self.svc.retrieve(index, docs[doc_id][0], 1, mode="dense"))[0][0]
                assert top.text == docs[doc_id][0] and top.score == pytest.approx(1.0, abs=1e-4)
        for index in INDEXES:
            if index not in self.model:
                with pytest.raises(NotFoundError):
                    await self.svc.list_documents(index)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_random_concurrent_histories_match_the_model(tmp_path: Path, seed: int) -> None:
    num_shards = 2 + seed % 2
    check_layout(tmp_path, num_shards)
    pool = LocalShardPool([ShardService(tmp_path, i, num_shards) for i in range(num_shards)])
    chunker = DocumentChunker(lambda t: len(t.split()), chunk_size=64, chunk_overlap=8)
    assert [c.text for c in chunker.chunk("doc 1 revision 2 of the notes", {})] == ["doc 1 revision 2 of the notes"]
    svc = DocumentService(pool, HashEmbedder(), chunker, storage_dir=tmp_path, embedding_model="")
    history = History(seed, svc, tmp_path)
    try:
        for step in range(STEPS):
            try:
                await history.step()
                await history.check()
            except BaseException as e:
                raise AssertionError(f"seed {seed}, step {step} ({dict(history.seen)}): {e!r}") from e
    finally:
        pool.close()
    print(f"seed {seed}: {dict(history.seen)}")
    # the shards reopen healthy, with the same content
    pool = LocalShardPool([ShardService(tmp_path, i, num_shards) for i in range(num_shards)])
    history.svc = DocumentService(pool, HashEmbedder(), chunker, storage_dir=tmp_path, embedding_model="")
    try:
        await history.check()
    finally:
        pool.close()
