"""API keys, request limits and path confinement over HTTP, on the in-process application."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from ragserve.http.security import KeyChecker
from ragserve.service.access import FULL_ACCESS, Principal, Role
from ragserve.service.snapshots import scope_folder
from ragserve.testing.fake_openai import FakeOpenAI
from ragserve.testing.inprocess import inprocess_app

KEY = "sk-test-key-0123456789"
# probes, the playground page (its API calls need the key) and the site icon
OPEN = {"/health", "/metrics", "/ui", "/ui/", "/favicon.ico"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as f:
        yield f


@pytest.fixture
def secured(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with (
        inprocess_app(tmp_path, embedder, fake.url, api_keys=[KEY, "second-key"]) as (app, _),
        TestClient(app) as client,
    ):
        yield client


@pytest.fixture
def limited(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with (
        inprocess_app(
            tmp_path,
            embedder,
            fake.url,
            max_request_bytes=4096,
            max_documents_per_request=3,
            max_document_chars=200,
            max_chat_messages=4,
            max_top_k=7,
            max_list_limit=20,
        ) as (app, _),
        TestClient(app) as client,
    ):
        client.post("/index", json={"index_name": "kb", "documents": [{"text": "KAITO runs models."}]})
        yield client


def concrete(path: str) -> str:
    return path.replace("{index_name}", "kb")


def flat_routes(app) -> list:
    """The app's routes, with those of included routers (FastAPI keeps those as one entry each)."""
    out = []
    for r in app.routes:
        inner = getattr(r, "original_router", None)
        out.extend(flat_routes(inner) if inner is not None else [r])
    return out


def all_routes(client: TestClient) -> list[tuple[str, str]]:
    routes = []
    for r in flat_routes(client.app):
        methods = getattr(r, "methods", None) or {"GET"}
        for m in sorted(methods - {"HEAD", "OPTIONS"}):
            routes.append((m, concrete(r.path)))
    return routes


def test_every_route_but_the_probes_needs_a_key(secured: TestClient) -> None:
    routes = all_routes(secured)
    api_routes = {concrete(r.path) for r in flat_routes(secured.app) if isinstance(r, APIRoute)}
    assert {"/v1/chat/completions", "/index", "/persist/kb", "/retrieve", "/openapi.json"} <= api_routes | {
        p for _, p in routes
    }
    for method, path in routes:
        bare = secured.request(method, path)
        wrong = secured.request(method, path, headers={"Authorization": "Bearer sk-wrong"})
        right = secured.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        if path in OPEN:
            assert bare.status_code == 200, path
            continue
        assert bare.status_code == 401 and wrong.status_code == 401, (method, path)
        assert bare.headers["www-authenticate"].startswith("Bearer")
        assert right.status_code != 401, (method, path)
    # a second configured key works too; other schemes and empty tokens do not
    assert secured.get("/indexes", headers={"Authorization": "Bearer second-key"}).status_code == 200
    assert secured.get("/indexes", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
    assert secured.get("/indexes", headers={"Authorization": "Bearer "}).status_code == 401


def test_unauthenticated_error_shapes(secured: TestClient) -> None:
    r = secured.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error" and "Bearer" in err["message"]
    r = secured.get("/indexes", headers={"Authorization": "Bearer nope"})
    assert r.json() == {"detail": "Incorrect API key provided."}
    # unknown paths do not reveal whether they exist
    assert secured.get("/no/such/route").status_code == 401
    assert secured.get("/no/such/route", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


def test_the_key_is_never_logged(secured: TestClient, caplog) -> None:
    caplog.set_level("DEBUG")
    secured.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    secured.get("/indexes", headers={"Authorization": "Bearer sk-wrong-key-987"})
    assert KEY not in caplog.text and "sk-wrong-key-987" not in caplog.text


def test_key_checker_compares_every_key() -> None:
    reader = Principal(Role.READ, ("kb",))
    check = KeyChecker([("a" * 32, FULL_ACCESS), ("b" * 32, reader)])
    assert check("a" * 32) == FULL_ACCESS and check("b" * 32) == reader
    assert check("a" * 31) is None and check("") is None and check("c" * 32) is None
    with pytest.raises(ValueError):
        KeyChecker([])


def test_a_websocket_needs_a_key_too() -> None:
    # no route takes a websocket today; one added later must not be reached with full access
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    from ragserve.http.security import ApiKeyMiddleware, principal_of

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_json({"role": principal_of(ws.scope).role.name})
        await ws.close()

    reader = Principal(Role.READ, ("kb",))
    app = ApiKeyMiddleware(Starlette(routes=[WebSocketRoute("/ws", echo)]), keys=[(KEY, reader)])
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect("/ws", headers=headers):
                pass
            assert closed.value.code == 1008
        with client.websocket_connect("/ws", headers={"Authorization": f"Bearer {KEY}"}) as ws:
            assert ws.receive_json() == {"role": "READ"}


def test_a_key_must_reach_every_index_of_a_query_and_the_refusal_names_the_first_it_does_not() -> None:
    from ragserve.service.access import ForbiddenError

    team = Principal(Role.READ, ("team-a*", "shared"))
    team.require(Role.READ, ["team-a-docs", "shared", "team-a-wiki"])
    team.require(Role.READ, ())  # nothing named: the role alone
    for names, refused in ((["team-a-docs", "team-b", "other"], "team-b"), (("shared", "x"), "x"), ("y", "y")):
        with pytest.raises(ForbiddenError) as e:
            team.require(Role.READ, names)
        assert f"'{refused}'" in e.value.message and e.value.param == "index_name"
    with pytest.raises(ForbiddenError, match="needs write"):  # the role first, whatever the indexes
        team.require(Role.WRITE, ["team-a-docs"])


def test_body_size_limit_is_413_declared_or_streamed(limited: TestClient) -> None:
    big = {"index_name": "kb", "documents": [{"text": "x" * 5000}]}
    r = limited.post("/index", json=big)
    assert r.status_code == 413 and "4096 bytes" in r.json()["detail"]
    r = limited.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "y" * 5000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while the body streams
        body = json.dumps(big).encode()
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    r = limited.post("/index", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_document_limits(limited: TestClient) -> None:
    four = [{"text": f"document {i}"} for i in range(4)]
    r = limited.post("/index", json={"index_name": "kb", "documents": four})
    assert r.status_code == 413 and "at most 3" in r.json()["detail"]
    r = limited.post("/index", json={"index_name": "kb", "documents": [{"text": "z" * 201}]})
    assert r.status_code == 413 and "documents[0].text has 201 characters" in r.json()["detail"]
    r = limited.post("/indexes/kb/documents", json={"documents": [{"doc_id": "a", "text": "z" * 201}]})
    assert r.status_code == 413
    r = limited.post("/indexes/kb/documents/delete", json={"doc_ids": ["a", "b", "c", "d"]})
    assert r.status_code == 413 and "doc_ids" in r.json()["detail"]
    r = limited.post("/v1/embeddings", json={"input": ["a", "b", "c", "d"]})
    assert r.status_code == 413 and r.json()["error"]["param"] == "input"
    # at the limit is fine
    assert limited.post("/index", json={"index_name": "kb", "documents": four[:3]}).status_code == 200


def test_chat_and_retrieval_limits(limited: TestClient) -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 2 + [
        {"role": "user", "content": "q"}
    ]
    r = limited.post("/v1/chat/completions", json={"messages": msgs})
    assert r.status_code == 400 and "at most 4" in r.json()["error"]["message"]
    r = limited.post(
        "/v1/chat/completions", json={"index_name": "kb", "top_k": 8, "messages": [{"role": "user", "content": "q"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"
    r = limited.post("/retrieve", json={"index_name": "kb", "query": "q", "max_node_count": 8})
    assert r.status_code == 400 and "max_node_count must be at most 7" in r.json()["detail"]
    assert limited.post("/query", json={"index_name": "kb", "query": "q", "top_k": 8}).status_code == 400
    r = limited.get("/indexes/kb/documents", params={"limit": 21})
    assert r.status_code == 400 and "limit must be at most 20" in r.json()["detail"]
    assert limited.get("/indexes/kb/documents", params={"limit": 20}).status_code == 200
    assert limited.post("/retrieve", json={"index_name": "kb", "query": "q", "max_node_count": 7}).status_code == 200


@pytest.mark.parametrize("name", ["bad name", "a/b", "..", ".hidden", "x" * 129, "ünï", "a%2Fb"])
def test_index_names_are_validated_with_the_rule(limited: TestClient, name: str) -> None:
    r = limited.post("/index", json={"index_name": name, "documents": [{"text": "t"}]})
    assert r.status_code in (400, 422)
    assert "index names are 1-128 characters" in json.dumps(r.json())


@pytest.mark.parametrize("path", ["../x", "/etc", "%2e%2e/x", "%252e%252e%252fx", "..%2Fx", "a/../../x", "."])
def test_persist_and_load_traversal_is_400(limited: TestClient, path: str) -> None:
    r = limited.post("/persist/kb", params={"path": path})
    assert r.status_code == 400, r.text
    assert limited.post("/load/kb", params={"path": path, "overwrite": True}).status_code == 400


# --- scoped keys (issue 11, item 16) ---------------------------------------------------------------
ADMIN, WRITER, READER, TEAM = "sk-admin-key", "sk-writer-key", "sk-reader-key", "sk-team-a-key"
SCOPED = [
    ADMIN,
    {"key": WRITER, "role": "write"},
    {"key": READER, "role": "read"},
    {"key": TEAM, "indexes": ["team-a*"], "role": "admin"},
]
CHAT = {"messages": [{"role": "user", "content": "What runs models?"}]}
# (method, path, body, role needed); {index} is the index the call is about
SCOPED_ROUTES = [
    ("GET", "/indexes/{index}/documents", None, "read"),
    ("GET", "/indexes/{index}/documents/d1", None, "read"),
    ("POST", "/retrieve", {"query": "models"}, "read"),
    ("POST", "/query", {"query": "models"}, "read"),
    ("POST", "/v1/chat/completions", CHAT, "read"),
    ("POST", "/index", {"documents": [{"text": "A new note about models."}]}, "write"),
    ("POST", "/indexes/{index}/documents", {"documents": [{"doc_id": "d1", "text": "Changed text."}]}, "write"),
    ("POST", "/indexes/{index}/documents/delete", {"doc_ids": ["nope"]}, "write"),
    ("POST", "/persist/{index}", None, "admin"),
    ("POST", "/load/{index}?overwrite=true", None, "admin"),
    ("DELETE", "/indexes/{index}", None, "admin"),
]
RANK = {"read": 1, "write": 2, "admin": 3}


@pytest.fixture
def scoped(tmp_path, embedder, fake) -> Iterator[TestClient]:
    with (
        inprocess_app(tmp_path, embedder, fake.url, api_keys=SCOPED, similarity_threshold=0.0) as (app, _),
        TestClient(app) as client,
    ):
        for index in ("kb", "team-a-docs"):
            r = client.post(
                "/index",
                headers=bearer(ADMIN),
                json={"index_name": index, "documents": [{"doc_id": "d1", "text": "KAITO runs models on Kubernetes."}]},
            )
            assert r.status_code == 200, r.text
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def call(client: TestClient, key: str, method: str, path: str, body: dict | None, index: str):
    url = path.format(index=index)
    if body is not None and path in {"/retrieve", "/query", "/index", "/v1/chat/completions"}:
        body = {**body, "index_name": index}
    return client.request(method, url, headers=bearer(key), json=body)


@pytest.mark.parametrize(("key", "role"), [(READER, "read"), (WRITER, "write")])
@pytest.mark.parametrize(("method", "path", "body", "needed"), SCOPED_ROUTES)
def test_each_role_reaches_what_it_may_and_gets_403_beyond(
    scoped: TestClient, key: str, role: str, method: str, path: str, body: dict | None, needed: str
) -> None:
    if path.startswith("/load"):
        assert call(scoped, ADMIN, "POST", "/persist/{index}", None, "kb").status_code == 200
    r = call(scoped, key, method, path, body, "kb")
    if RANK[role] >= RANK[needed]:
        assert r.status_code < 400, (role, path, r.text)
    else:
        assert r.status_code == 403, (role, path, r.text)
        shape = r.json()
        assert "error" in shape if path.startswith("/v1/") else "detail" in shape
        assert role in (shape["error"]["message"] if "error" in shape else shape["detail"])


@pytest.mark.parametrize(("method", "path", "body", "needed"), SCOPED_ROUTES)
def test_an_index_scoped_key_reaches_only_its_indexes(
    scoped: TestClient, method: str, path: str, body: dict | None, needed: str
) -> None:
    if path.startswith("/load"):
        assert call(scoped, TEAM, "POST", "/persist/{index}", None, "team-a-docs").status_code == 200
    assert call(scoped, TEAM, method, path, body, "team-a-docs").status_code < 400
    r = call(scoped, TEAM, method, path, body, "kb")
    assert r.status_code == 403 and "kb" in r.text
    assert scoped.get("/indexes/kb/documents", headers=bearer(ADMIN)).json()["total_items"] == 1  # untouched


def test_index_listing_shows_only_the_keys_indexes(scoped: TestClient) -> None:
    assert scoped.get("/indexes", headers=bearer(TEAM)).json() == ["team-a-docs"]
    assert scoped.get("/indexes", headers=bearer(READER)).json() == ["kb", "team-a-docs"]


def test_passthrough_chat_needs_only_a_valid_key(scoped: TestClient) -> None:
    r = scoped.post("/v1/chat/completions", headers=bearer(TEAM), json=CHAT)
    assert r.status_code == 200 and r.headers["x-rag-mode"] == "passthrough"


# --- secure by default off the loopback (item 17) -----------------------------------------------------
@pytest.mark.parametrize(
    ("host", "keys", "allow", "ok"),
    [
        ("127.0.0.1", False, False, True),
        ("localhost", False, False, True),
        ("::1", False, False, True),
        ("0.0.0.0", False, False, False),
        ("10.1.2.3", False, False, False),
        ("my-host", False, False, False),
        ("0.0.0.0", True, False, True),
        ("0.0.0.0", False, True, True),
    ],
)
def test_an_open_server_beyond_the_loopback_refuses_to_start(host: str, keys: bool, allow: bool, ok: bool) -> None:
    from ragserve.service.access import check_exposure

    if ok:
        check_exposure(host, keys, allow)
    else:
        with pytest.raises(ValueError, match="beyond the loopback"):
            check_exposure(host, keys, allow)


def test_remote_llm_config_listens_on_the_loopback() -> None:
    import yaml

    from tests.integration.conftest import REPO

    cfg = yaml.safe_load((REPO / "configs" / "remote-llm.yaml").read_text())
    assert cfg["http_options"]["host"] == "127.0.0.1"


# --- a snapshot belongs to the index it was persisted from (issue 21) ---------------------------------
def test_a_scoped_key_cannot_load_another_indexs_snapshot_into_its_own(scoped: TestClient) -> None:
    assert scoped.post("/persist/kb", headers=bearer(ADMIN)).status_code == 200  # snapshots/kb, from kb
    assert scoped.post("/persist/kb?path=shared", headers=bearer(ADMIN)).status_code == 200  # shared/kb
    # the same snapshots put into the team's own scope folder by an unscoped admin are refused too
    folder = scope_folder(Principal(Role.ADMIN, ("team-a*",)))
    assert scoped.post(f"/persist/kb?path={folder}", headers=bearer(ADMIN)).status_code == 200  # <team>/kb
    for path in ("kb", "shared/kb"):
        r = scoped.post(f"/load/team-a-docs?path={path}&overwrite=true", headers=bearer(TEAM))
        assert r.status_code == 403, r.text
        detail = r.json()["detail"]
        assert f"no snapshot at '{path}' this API key may load" in detail and "team-a*" in detail
        r = scoped.post(f"/load/team-a-new?path={path}", headers=bearer(TEAM))
        assert r.status_code == 403, r.text
    # nothing was loaded: the scoped index still holds its own document, the new one does not exist
    docs = scoped.get("/indexes/team-a-docs/documents", headers=bearer(TEAM)).json()
    assert [d["text"] for d in docs["documents"]] == ["KAITO runs models on Kubernetes."]
    assert scoped.get("/indexes", headers=bearer(TEAM)).json() == ["team-a-docs"]
    # an unscoped admin may, and a scoped key may load its own index's snapshot under another name
    assert scoped.post("/load/team-a-copy?path=kb", headers=bearer(ADMIN)).status_code == 200
    assert scoped.post("/persist/team-a-docs?path=mine", headers=bearer(TEAM)).status_code == 200
    assert scoped.post("/load/team-a-other?path=mine/team-a-docs", headers=bearer(TEAM)).status_code == 200


def test_a_snapshot_without_a_recorded_source_is_refused_to_a_scoped_key(scoped: TestClient, tmp_path) -> None:
    assert scoped.post("/persist/team-a-docs", headers=bearer(TEAM)).status_code == 200
    folder = scope_folder(Principal(Role.ADMIN, ("team-a*",)))
    snapshots = [p.parent for p in tmp_path.rglob(f"snapshots/{folder}/team-a-docs/manifest.json")]
    assert len(snapshots) == 1
    manifest = json.loads((snapshots[0] / "manifest.json").read_text())
    del manifest["index_name"]  # e.g. a snapshot written by another tool
    (snapshots[0] / "manifest.json").write_text(json.dumps(manifest))
    r = scoped.post("/load/team-a-new?path=team-a-docs", headers=bearer(TEAM))
    assert r.status_code == 403 and "this API key may load" in r.json()["detail"], r.text
    r = scoped.post(f"/load/team-a-new?path={folder}/team-a-docs", headers=bearer(ADMIN))
    assert r.status_code == 200, r.text


def test_a_scoped_keys_persist_cannot_tell_what_other_scopes_keep(scoped: TestClient, tmp_path) -> None:
    """A persist refused because another snapshot was in the way (around the path, inside it, a
    file on it), against one that succeeds, told a scoped key which paths held another tenant's
    snapshots (the hostile review). A scoped key's paths are its scope folder's: what any other
    scope keeps, anywhere, changes nothing it hears."""

    def answers() -> list[tuple[int, str]]:
        got = []
        for path in ("x", "x/kb", "x/kb/deeper", "afile", "afile/below", ""):
            r = scoped.post("/persist/team-a-docs", params={"path": path} if path else {}, headers=bearer(TEAM))
            got.append((r.status_code, r.text))
        shutil.rmtree(tmp_path / "snapshots" / scope_folder(Principal(Role.ADMIN, ("team-a*",))))
        return got

    alone = answers()
    assert [code for code, _ in alone] == [200] * 6, alone
    # another scope fills the shared snapshots folder with everything that used to be in the way
    assert scoped.post("/persist/kb?path=x", headers=bearer(ADMIN)).status_code == 200  # x/kb
    assert scoped.post("/persist/kb", headers=bearer(ADMIN)).status_code == 200
    (tmp_path / "snapshots" / "afile").write_text("a file in the way")
    (tmp_path / "snapshots" / "team-a-docs").mkdir()
    (tmp_path / "snapshots" / "team-a-docs" / "manifest.json").write_text('{"index_name": "kb", "parts": []}')
    assert answers() == alone
    # the team's snapshots never landed among the others', and those are whole
    assert (tmp_path / "snapshots" / "team-a-docs" / "manifest.json").read_text().startswith('{"index_name": "kb"')
    assert scoped.post("/load/kb-again?path=x/kb", headers=bearer(ADMIN)).status_code == 200


def test_a_path_the_filesystem_cannot_hold_is_a_400(scoped: TestClient) -> None:
    for key in (TEAM, ADMIN):
        for path in ("a" * 300, "a/" * 300, "/".join(["a" * 200] * 3)):
            for route in ("/persist/team-a-docs", "/load/team-a-copy"):
                r = scoped.post(route, params={"path": path}, headers=bearer(key))
                assert r.status_code == 400 and "at most" in r.json()["detail"], r.text


@pytest.mark.parametrize(
    ("indexes", "same_as_team"),
    [(("team-a*",), True), (("team-a*", "team-a*"), True), (("team-a-docs",), False), (("kb",), False)],
)
def test_scope_folders(indexes: tuple[str, ...], same_as_team: bool) -> None:
    team = scope_folder(Principal(Role.ADMIN, ("team-a*",)))
    assert team.startswith(".scopes/") and scope_folder(FULL_ACCESS) == ""
    assert (scope_folder(Principal(Role.ADMIN, indexes)) == team) is same_as_team
    assert scope_folder(Principal(Role.ADMIN, ("b", "a"))) == scope_folder(Principal(Role.ADMIN, ("a", "b")))
    assert scope_folder(Principal(Role.ADMIN, ("a\nb",))) != scope_folder(Principal(Role.ADMIN, ("a", "b")))


def test_a_scoped_key_cannot_tell_a_missing_snapshot_from_one_it_may_not_read(scoped: TestClient, tmp_path) -> None:
    """A 404 for a path with nothing there and a 403 for another index's snapshot told a scoped key
    which paths exist (the hostile probe): every path it may not load gets the same 403, whatever
    is or is not there. A key for every index still hears what is wrong."""
    assert scoped.post("/persist/kb?path=elsewhere", headers=bearer(ADMIN)).status_code == 200
    (tmp_path / "snapshots" / "afile").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "snapshots" / "afile").write_text("not a snapshot")
    answers = set()
    for path in ("elsewhere/kb", "nothing/here", "elsewhere", "afile"):
        r = scoped.post(f"/load/team-a-new?path={path}", headers=bearer(TEAM))
        assert r.status_code == 403, (path, r.text)
        answers.add(r.json()["detail"].replace(f"'{path}'", "'P'"))
    assert len(answers) == 1, answers
    assert scoped.post("/load/team-a-new?path=nothing/here", headers=bearer(ADMIN)).status_code == 404
    assert scoped.post("/load/team-a-new?path=afile", headers=bearer(ADMIN)).status_code == 400


@pytest.mark.parametrize(
    ("principal", "source", "ok"),
    [
        (FULL_ACCESS, "anything", True),
        (FULL_ACCESS, None, True),
        (Principal(Role.ADMIN, ("team-a*",)), "team-a-x", True),
        (Principal(Role.ADMIN, ("team-a*",)), "kb", False),
        (Principal(Role.ADMIN, ("team-a*",)), None, False),
        (Principal(Role.ADMIN, ("team-a*",)), "", False),
        (Principal(Role.ADMIN, ("team-a*",)), ["team-a-x"], False),
    ],
)
def test_require_source(principal: Principal, source: object, ok: bool) -> None:
    from ragserve.service.access import ForbiddenError

    if ok:
        principal.require_source(source, "the snapshot at 'p'")
    else:
        with pytest.raises(ForbiddenError, match="the snapshot at 'p'"):
            principal.require_source(source, "the snapshot at 'p'")


@pytest.mark.parametrize(
    ("principal", "role", "code"),
    [
        (FULL_ACCESS, Role.WRITE, None),
        (Principal(Role.WRITE, ("*",)), Role.WRITE, None),
        (Principal(Role.WRITE, ("kb", "*")), Role.WRITE, None),
        (Principal(Role.READ, ("*",)), Role.WRITE, "insufficient_role"),
        (Principal(Role.ADMIN, ("team-a*",)), Role.WRITE, "unscoped_key_required"),
        (Principal(Role.ADMIN, ("team-a*",)), Role.READ, "unscoped_key_required"),
    ],
)
def test_require_unscoped(principal: Principal, role: Role, code: str | None) -> None:
    """Data of no index (uploaded files): only a key for every index, of the role."""
    from ragserve.service.access import ForbiddenError

    if code is None:
        principal.require_unscoped(role, "uploaded files")
    else:
        with pytest.raises(ForbiddenError) as err:
            principal.require_unscoped(role, "uploaded files")
        assert err.value.code == code


def test_only_an_operator_sees_the_upstream_addresses(scoped: TestClient) -> None:
    """/ui/config names the upstream LLM's address (a host inside the deployment) to a key that
    administers every index, never to a scoped or read-only one (a hostile review's finding)."""
    for key, shown in ((ADMIN, True), (WRITER, False), (READER, False), (TEAM, False)):
        r = scoped.get("/ui/config", headers=bearer(key))
        assert r.status_code == 200, r.text
        assert ("llm_url" in r.json()["settings"]) is shown and ("127.0.0.1" in r.text) is shown, (key, r.text)
