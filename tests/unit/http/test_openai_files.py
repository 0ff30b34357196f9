"""The OpenAI Files API (``/v1/files``) driven by the official ``openai`` SDK, unchanged, against the
in-process application: upload, list (pages, order, purpose), retrieve, content, delete; every
client mistake the 4xx OpenAI would give, in OpenAI's error shape; access; concurrent uploads; the
body limit of the upload route, its own."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ragserve.service.file_store import BLOBS_DIR, FILES_DIR, TMP_PREFIX
from ragserve.testing.inprocess import inprocess_app

KEY = "sk-files-test"
SCOPED = "sk-files-scoped"
READER = "sk-files-reader"
MAX_FILE = 64 * 1024
MARKDOWN = b"# Pumps\n\nThe pump on line 3 was serviced in May.\n"
# Every byte value, and what a multipart parser could mistake for a boundary: CRLF, dashes.
BINARY = bytes(range(256)) * 8 + b"\r\n--\r\n\r\n--boundary\r\n" + bytes(range(255, -1, -1))


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedding_model) -> Iterator[tuple[FastAPI, Path]]:
    from ragserve.testing.embedder import InProcessEmbedder

    storage = tmp_path_factory.mktemp("files")
    with inprocess_app(
        storage,
        InProcessEmbedder(embedding_model),
        "http://127.0.0.1:9/v1",  # no chat here: the upstream is never called
        api_keys=[
            KEY,
            {"key": SCOPED, "indexes": ["kb*"], "role": "admin"},
            {"key": READER, "indexes": ["*"], "role": "read"},
        ],
        max_file_bytes=MAX_FILE,
        max_request_bytes=4096,
    ) as (app, _):
        yield app, storage


@pytest.fixture(scope="module")
def http(served) -> Iterator[TestClient]:
    with TestClient(served[0]) as c:
        yield c


def sdk(http: TestClient, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0)


@pytest.fixture
def client(http: TestClient) -> openai.OpenAI:
    return sdk(http)


def blobs(storage: Path) -> list[str]:
    return sorted(os.listdir(storage / FILES_DIR / BLOBS_DIR))


def test_upload_retrieve_and_download_round_trip(client: openai.OpenAI, tmp_path: Path) -> None:
    made = client.files.create(file=("notes.md", MARKDOWN), purpose="assistants")
    assert made.id.startswith("file-") and len(made.id) == 29
    assert (made.object, made.bytes, made.filename, made.purpose, made.status) == (
        "file",
        len(MARKDOWN),
        "notes.md",
        "assistants",
        "processed",
    )
    assert made.expires_at is None and made.status_details is None
    assert client.files.retrieve(made.id) == made
    raw = client.files.with_raw_response.content(made.id)
    assert raw.headers["content-type"] == "application/octet-stream"
    assert raw.headers["content-length"] == str(len(MARKDOWN))
    assert raw.parse().read() == MARKDOWN

    path = tmp_path / "data.bin"
    path.write_bytes(BINARY)
    binary = client.files.create(file=path, purpose="user_data")  # the SDK reads the file and names it
    assert (binary.filename, binary.bytes) == ("data.bin", len(BINARY))
    assert client.files.content(binary.id).read() == BINARY


def test_a_path_in_the_name_keeps_the_base_name(client: openai.OpenAI) -> None:
    made = client.files.create(file=("docs/guide/intro.md", MARKDOWN), purpose="assistants")
    assert made.filename == "intro.md"


def test_list_pages_orders_and_filters(tmp_path: Path, embedding_model) -> None:
    from ragserve.testing.embedder import InProcessEmbedder

    with (
        inprocess_app(tmp_path, InProcessEmbedder(embedding_model), "http://127.0.0.1:9/v1") as (app, _),
        TestClient(app) as http,
    ):
        client = sdk(http)
        assert client.files.list().data == []
        made = [
            client.files.create(file=(f"f{i}.txt", b"x" * (i + 1)), purpose="batch" if i % 2 else "assistants")
            for i in range(5)
        ]
        ids = [f.id for f in made]
        assert ids == sorted(ids)  # ids sort by age

        page = client.files.list()  # newest first, OpenAI's default
        assert [f.id for f in page.data] == ids[::-1] and page.has_more is False
        first = client.files.list(limit=2, order="asc")
        assert [f.id for f in first.data] == ids[:2] and first.has_more is True
        assert first.first_id == ids[0] and first.last_id == ids[1]
        second = client.files.list(limit=2, order="asc", after=first.last_id)
        assert [f.id for f in second.data] == ids[2:4]
        assert [f.id for f in client.files.list(limit=2, order="asc")] == ids  # the SDK's auto-paging
        assert [f.id for f in client.files.list(limit=1, order="desc")] == ids[::-1]
        assert [f.id for f in client.files.list(purpose="batch", order="asc")] == ids[1::2]
        assert [f.id for f in client.files.list(purpose="assistants", order="desc", after=ids[4])] == [ids[2], ids[0]]

        client.files.delete(ids[1])  # a cursor that is gone still pages
        assert [f.id for f in client.files.list(order="asc", after=ids[1])] == ids[2:]

        for query, param in (
            ({"limit": 0}, "limit"),
            ({"limit": 10_001}, "limit"),
            ({"order": "sideways"}, "order"),
            ({"purpose": "memes"}, "purpose"),
        ):
            with pytest.raises(openai.BadRequestError) as err:
                client.files.list(**query)  # type: ignore[arg-type]
            assert err.value.param == param, query


def test_delete_then_every_route_is_a_404(client: openai.OpenAI, served) -> None:
    made = client.files.create(file=("gone.md", MARKDOWN), purpose="assistants")
    assert made.id in blobs(served[1])
    deleted = client.files.delete(made.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "file", True)
    assert made.id not in blobs(served[1])
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as err:
            call(made.id)
        assert made.id in err.value.message and err.value.param == "file_id"
        assert err.value.code == "file_not_found"
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-nope")


@pytest.mark.parametrize(
    ("name", "data", "purpose", "param"),
    [
        ("a.md", MARKDOWN, "memes", "purpose"),
        ("../../etc/passwd", MARKDOWN, "assistants", "filename"),
        ("/etc/passwd", MARKDOWN, "assistants", "filename"),
        ("evil\u202etxt.md", MARKDOWN, "assistants", "filename"),  # a bidi override
        ("x" * 300 + ".md", MARKDOWN, "assistants", "filename"),
        ("empty.md", b"", "assistants", "file"),
    ],
)
def test_bad_uploads_are_a_400_naming_the_field_and_store_nothing(
    client: openai.OpenAI, served, name: str, data: bytes, purpose: str, param: str
) -> None:
    before = blobs(served[1])
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=(name, data), purpose=purpose)  # type: ignore[arg-type]
    assert err.value.status_code == 400 and err.value.param == param, err.value.message
    assert err.value.type == "invalid_request_error"
    if param == "purpose":
        assert "assistants, batch, fine-tune, vision, user_data, evals" in err.value.message
    assert blobs(served[1]) == before


def test_expires_after_is_refused_with_a_reason(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(
            file=("a.md", MARKDOWN), purpose="assistants", expires_after={"anchor": "created_at", "seconds": 3600}
        )
    assert err.value.param == "expires_after" and "not supported" in err.value.message


def test_too_large_is_a_413_and_leaves_nothing(client: openai.OpenAI, served) -> None:
    before = blobs(served[1])
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.bin", b"x" * (MAX_FILE + 1)), purpose="assistants")
    assert err.value.status_code == 413 and err.value.param == "file"
    assert "max_file_bytes" in err.value.message
    assert blobs(served[1]) == before and not [n for n in before if n.startswith(TMP_PREFIX)]
    exact = client.files.create(file=("max.bin", b"x" * MAX_FILE), purpose="assistants")
    assert exact.bytes == MAX_FILE


def test_the_upload_route_has_its_own_body_limit(http: TestClient, client: openai.OpenAI) -> None:
    """max_request_bytes is 4096 here: a 40 KiB file still uploads; a 40 KiB JSON body elsewhere does not."""
    assert client.files.create(file=("mid.bin", b"y" * 40_000), purpose="assistants").bytes == 40_000
    r = http.post(
        "/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"}, json={"input": "z" * 40_000, "model": "m"}
    )
    assert r.status_code == 413
    r = http.post(  # a body far past file + form: refused by its declared length, before it is read
        "/v1/files", headers={"Authorization": f"Bearer {KEY}", "Content-Length": str(10 * MAX_FILE)}, content=b""
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_form_mistakes_are_400s_naming_the_field(http: TestClient) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}

    def post(files: dict) -> httpx.Response:
        return http.post("/v1/files", headers=auth, files=files)

    cases = [
        ({"purpose": (None, "assistants")}, "file"),
        ({"file": ("a.md", MARKDOWN)}, "purpose"),
        ({"file": (None, "text, not a file"), "purpose": (None, "assistants")}, "file"),
        ({"purpose": (None, "assistants"), "colour": (None, "blue"), "file": ("a.md", MARKDOWN)}, "colour"),
    ]
    for files, param in cases:
        r = post(files)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (files, r.text)

    r = http.post("/v1/files", headers=auth, json={"purpose": "assistants"})
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]["message"]

    boundary = "b0undary"

    def form(filename: str) -> bytes:
        return (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n\r\n'
            f"hello\r\n--{boundary}--\r\n"
        ).encode()

    headers = {**auth, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    r = http.post("/v1/files", headers=headers, content=form("a\x01b.md"))  # httpx would have escaped it
    assert r.status_code == 400 and r.json()["error"]["param"] == "filename"
    assert "U+0001" in r.json()["error"]["message"]
    assert http.post("/v1/files", headers=headers, content=form("ab.md")).status_code == 200
    r = http.post("/v1/files", headers=headers, content=form("ab.md")[:-10])  # no closing boundary
    assert r.status_code == 400 and "ends inside a part" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "body"


def test_only_a_write_key_for_every_index_may_use_files(http: TestClient, client: openai.OpenAI) -> None:
    made = client.files.create(file=("a.md", MARKDOWN), purpose="assistants")
    for key in (SCOPED, READER):
        other = sdk(http, key)
        with pytest.raises(openai.PermissionDeniedError) as err:
            other.files.retrieve(made.id)
        assert err.value.code in {"unscoped_key_required", "insufficient_role"}
        with pytest.raises(openai.PermissionDeniedError):
            other.files.create(file=("b.md", MARKDOWN), purpose="assistants")
        with pytest.raises(openai.PermissionDeniedError):
            other.files.list()
    with pytest.raises(openai.AuthenticationError):
        sdk(http, "sk-wrong").files.list()


async def test_concurrent_uploads_each_get_their_own_file(served) -> None:
    app, _ = served
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0)
        bodies = [bytes([i]) * (1000 + i) for i in range(8)]
        made = await asyncio.gather(
            *(client.files.create(file=(f"c{i}.bin", b), purpose="user_data") for i, b in enumerate(bodies))
        )
        assert len({f.id for f in made}) == 8
        for f, body in zip(made, bodies, strict=True):
            assert f.bytes == len(body)
            assert (await client.files.content(f.id)).read() == body


def test_the_openapi_document_lists_the_files_routes(http: TestClient) -> None:
    paths = http.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()["paths"]
    assert {"post", "get"} <= paths["/v1/files"].keys()
    assert {"get", "delete"} <= paths["/v1/files/{file_id}"].keys()
    form = paths["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["file", "purpose"]


def test_health_answers_while_a_large_upload_streams_to_disk(tmp_path: Path, embedding_model) -> None:
    """The upload is parsed, counted, hashed and written off the event loop: /health stays fast."""
    import threading
    import time

    from ragserve.testing.embedder import InProcessEmbedder
    from tests.live_server import live_app

    data = b"\r\n--\r\n-" * (3 * 1024 * 1024)  # 21 MiB of what a boundary search must look at
    with live_app(tmp_path, InProcessEmbedder(embedding_model), max_file_bytes=64 * 1024 * 1024) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        made: list[openai.types.FileObject] = []
        worker = threading.Thread(
            target=lambda: made.append(client.files.create(file=("big.txt", data), purpose="user_data"))
        )
        worker.start()
        slowest = 0.0
        with httpx.Client(timeout=30) as http:
            while worker.is_alive():
                t0 = time.perf_counter()
                assert http.get(f"{url}/health").status_code == 200
                slowest = max(slowest, time.perf_counter() - t0)
                time.sleep(0.02)
        worker.join()
        assert made and made[0].bytes == len(data)
        assert client.files.content(made[0].id).read() == data
        assert slowest < 1.0, f"/health took {slowest:.2f} s during the upload"
