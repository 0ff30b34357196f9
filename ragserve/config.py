"""The application's settings: the configuration contract of docs/architecture.md §3.

One model is the ``args`` of ``ragserve.deployments.builder:build_app`` in every serve config file.
Every field can be overridden by an environment variable ``RAGSERVE_<FIELD>`` (list and dict
values as JSON), and the environment wins over the config file, so that one config file
serves many environments (a KubeRay pod sets ``RAGSERVE_LLM_URL`` without editing YAML).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ragserve.api.documents import MAX_LIST_PAGE, QueryRewrite, RetrievalMode
from ragserve.api.index_spec import IndexSpec
from ragserve.jobs.webhook import validate_webhook_url, webhook_key

LlmEngineName = Literal["transformers", "vllm", "openai"]


#: A key's ``name`` (a metrics label and a ``GET /usage`` row, never the key itself).
KEY_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


#: The names usage is metered under where a key has none ("unnamed") or no keys are configured.
RESERVED_KEY_NAMES = frozenset({"anonymous", "unnamed"})


class ScopedKey(BaseModel):
    """An API key limited to some indexes (glob patterns) and a role: ``read`` may retrieve, query,
    chat and list; ``write`` also changes documents; ``admin`` also drops, persists and loads indexes."""

    # an error never echoes what was given: it may hold the key
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)
    key: SecretStr
    indexes: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    role: Literal["read", "write", "admin"] = "read"
    name: str | None = Field(
        default=None,
        pattern=KEY_NAME_PATTERN,
        description="What usage is metered and reported under (GET /usage, the ragserve_usage_* metrics): "
        "1 to 64 of A-Z a-z 0-9 . _ -, unique among the keys. None: metered as 'unnamed'.",
    )
    requests_per_minute: int | None = Field(
        default=None, ge=1, description="Requests admitted per UTC minute, across every ingress replica (429 past it)."
    )
    tokens_per_day: int | None = Field(
        default=None,
        ge=1,
        description="Prompt, completion and embedding tokens per UTC day; a request is refused (429) once "
        "what was recorded today reaches it. A request already admitted (a stream) is never cut off.",
    )

    @model_validator(mode="after")
    def _limits_need_a_name(self) -> ScopedKey:
        # a key's windows and budget are kept under its name: keys without one would share them
        if (self.requests_per_minute is not None or self.tokens_per_day is not None) and self.name is None:
            raise ValueError(
                "a key with requests_per_minute or tokens_per_day needs a name: its limits are counted under it"
            )
        return self


QueryEmbeddingSetting = Literal["ingress", "deployment", "auto"]


class Settings(BaseSettings):
    """Everything a ragserve application needs to know; defaults are the embedded CPU setup."""

    # hide_input_in_errors: an error names the field and what is wrong, never the value given, which
    # may be a key (api_keys, llm_api_key, job_webhook_secret)
    model_config = SettingsConfigDict(
        env_prefix="RAGSERVE_", extra="forbid", validate_default=True, hide_input_in_errors=True
    )

    # --- generation -------------------------------------------------------------------------
    llm_engine: LlmEngineName = "transformers"
    llm_model: str | None = Field(
        default=None,
        description="Model id or local path. None: the packaged Gemma 3 270M GGUF (transformers engine).",
    )
    llm_url: str | None = Field(default=None, description="Base URL of a remote OpenAI-compatible server.")
    llm_api_key: SecretStr | None = Field(default=None, description="Bearer key of the remote LLM (never logged).")
    llm_timeout_s: float = Field(default=120.0, gt=0)
    llm_engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra engine arguments (vLLM AsyncEngineArgs, transformers)."
    )
    model_cache_dir: str | None = Field(
        default=None, description="Where converted models are cached. None: <storage_dir>/models."
    )
    llm_in_ingress: bool | None = Field(
        default=None,
        description="Run the remote (openai) engine inside the ingress, not in a Generator "
        "deployment: it is only an HTTP client, and this saves an actor hop per request. None: yes for openai.",
    )
    prompt_format: Literal["auto", "chat", "completion"] = Field(
        default="auto",
        description="How the transformers engine prompts its model. auto: the model's chat "
        "template if it has one, else plain text ending 'Question: ... Answer:' (a base model, like the packaged "
        "Gemma 3 270M, answers that and echoes chat turns); chat or completion force one.",
    )
    context_window: int | None = Field(default=None, gt=0, description="Overrides what the engine reports.")
    default_max_tokens: int = Field(default=256, gt=0, description="Completion reserve when a request sets none.")
    min_completion_tokens: int = Field(default=16, gt=0, description="Smallest completion worth sending.")

    # --- embeddings -------------------------------------------------------------------------
    embedding_model: str | None = Field(
        default=None, description="sentence-transformers id or path. None: the packaged all-MiniLM-L6-v2."
    )
    embedding_url: str | None = None
    embedding_api_key: SecretStr | None = None
    embedding_device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where the Embedder deployment runs the local model: auto: CUDA when torch sees a "
        "GPU, else the CPU; cuda: on the GPU or not at all (the Embedder fails to start, saying why, rather "
        "than fall back to the CPU). The ingress's own query copy (query_embedding) is always on the CPU.",
    )
    embedding_threads: int | None = Field(
        default=None,
        ge=1,
        description="torch threads of each of the Embedder's workers. None: the usable cores shared among the workers.",
    )
    embedding_workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Threads of the Embedder that encode document batches side by side, a batch each "
        "(ragserve.models.embeddings.EncodeWorkers). None: every usable core on a CPU, one on a GPU.",
    )
    embedding_batch_size: int = Field(default=32, gt=0)
    embedding_batch_wait_s: float = Field(default=0.005, ge=0)
    embedding_cache_size: int = Field(default=10_000, ge=0)
    embedding_cache_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    passage_cache_size: int = Field(
        default=20_000,
        ge=0,
        description="Vectors of evidence passages kept in each ingress replica, by text (0: none). A RAG "
        "chat embeds a dozen or more sentences of its sources to find its evidence; the same documents "
        "answer many questions, so their windows come back. About 1.5 KiB each for a 384-d model.",
    )
    query_embedding: QueryEmbeddingSetting = Field(
        default="auto",
        description="Where queries are embedded: in each ingress replica (a model copy per "
        "replica, no hop to the Embedder), in the Embedder deployment, or auto: the ingress for a small "
        "local CPU model (ragserve.service.query_embedding), the deployment for remote, GPU or large ones. "
        "Documents are always embedded by the Embedder deployment.",
    )
    query_embedding_graph: Literal["eager", "traced", "optimized"] = Field(
        default="optimized",
        description="How the ingress's query model runs on the CPU: eager (transformers' Python "
        "code), traced (a frozen TorchScript graph of the same operations) or optimized (traced, with fused, "
        "pre-packed oneDNN layers: on one thread all-MiniLM-L6-v2 encodes a query in ~3.4 ms instead of ~7, "
        "for ~60 MiB more in each ingress replica). A trace that disagrees with the eager model on probe texts "
        "is not used (ragserve.models.embeddings).",
    )
    query_embedding_threads: int = Field(
        default=1,
        ge=1,
        description="torch threads of the ingress's query model. One: a query is one short "
        "text, a second thread gains little, and on a busy machine threads that wait for each other's cores "
        "make an encode 10-50x slower (docs/benchmarks.md).",
    )

    # --- storage and retrieval --------------------------------------------------------------
    storage_dir: str = "./data"
    num_shards: int = Field(default=2, ge=1, le=256)
    faiss_device: Literal["cpu", "gpu", "auto"] = "cpu"
    faiss_index_kind: Literal["flat", "ivf", "hnsw"] = Field(
        default="flat", description="FAISS index of each shard: flat (exact), ivf or hnsw (approximate)."
    )
    faiss_index_params: dict[str, float] = Field(
        default_factory=dict,
        description="ivf: nlist, nprobe, train_min, retrain_growth; "
        "hnsw: m, ef_construction, ef_search, max_deleted_ratio.",
    )
    shard_num_cpus: float = Field(default=0.1, ge=0, description="CPUs reserved by each shard actor.")
    shard_reads_in_flight: int = Field(
        default=1,
        ge=0,
        le=1024,
        description="Calls a replica has out to one shard actor before it holds further query-path reads "
        "(searches, version reads, index lookups; never listings, counts, stats or writes) and sends them "
        "together, as one call, when a call returns: a call costs each side ~1.3 ms of CPU however little it "
        "asks, so under load reads share it. A batch runs on one actor thread: with cores to spare a shard, "
        "raise it; 0 sends every read alone (docs/architecture.md §6, 'Reads in batches').",
    )
    similarity_threshold: float = Field(
        default=0.35,
        ge=-1.0,
        le=1.0,
        description="Sources scoring below it are not relevant; a chat with none passes through (no_context). "
        "Lower than the answerability thresholds that decide whether relevant sources answer (docs/quality.md: "
        "on real documentation with MiniLM, answering sources score 0.39-0.5 as often as not).",
    )
    top_k: int = Field(default=5, ge=1, le=100)
    chunk_size: int = Field(default=256, ge=16, description="Sentence chunk size in embedding-model tokens.")
    chunk_overlap: int = Field(default=32, ge=0)

    # --- retrieval quality (docs/quality.md) ---------------------------------------------------
    retrieval_mode: RetrievalMode = Field(
        default="hybrid",
        description="hybrid: dense and lexical (BM25) candidates fused by reciprocal rank "
        "fusion; dense: cosine only; lexical: BM25 only. Requests may choose their own.",
    )
    hybrid_dense_weight: float = Field(
        default=0.6,
        ge=0,
        le=1,
        description="Hybrid fusion: a candidate scores this x its cosine (scaled over the candidates) + "
        "the rest x the share of the query's information (terms weighed by IDF) its text holds when the lexical "
        "search found it (docs/quality.md).",
    )
    retrieval_candidates: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Candidates each shard returns per list (dense, lexical) for "
        "the fusion; at least the request's top_k.",
    )
    lexical_min_match: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of a query's information (its terms weighed by IDF) a lexical hit must hold "
        "to be a candidate. 0: any; the fusion already credits a hit by that share.",
    )
    lexical_max_postings: int | None = Field(
        default=2000,
        ge=1,
        description="Bounds the cost of a lexical search per shard: BM25 is computed for every "
        "row a term matches, so terms are searched rarest first while the rows they match add up to at most this "
        "(frequent terms weigh little, and still count in the query's information). None: every term, whatever "
        "it costs.",
    )
    lexical_match_min_terms: int | None = Field(
        default=2,
        ge=1,
        description="A chunk containing every term of a query of at least this many terms "
        "(stopwords aside) counts as relevant whatever its cosine score: a part number or a name matched word "
        "for word passes similarity_threshold on its own. None: only the cosine score decides.",
    )
    reranker_model: str | None = Field(
        default=None,
        description="Local path of a sentence-transformers CrossEncoder that reorders the fused "
        "candidates (retrieval_candidates of them) before selection. None: no reranking (the CPU default: it "
        "runs a transformer over every candidate on every request).",
    )
    followup_terms: int = Field(
        default=4,
        ge=0,
        le=32,
        description="A follow-up that refers back to earlier turns ('How do I set it up?', 'And on Windows?') "
        "retrieves with this many salient terms of the earlier user turns (names, code identifiers, content words; "
        "newest turn first) added to it; a question with a subject of its own is retrieved alone. 0: never.",
    )
    query_rewrite: QueryRewrite = Field(
        default="off",
        description="llm: a follow-up question that refers back is first rewritten into a standalone one by "
        "the generator (one short extra generation); off: only the deterministic follow-up query (followup_terms).",
    )
    sources_in_content: bool = Field(
        default=False,
        description="Append a plain 'Sources:' list to RAG answers' text, for clients that "
        "drop the response's extra fields (citations, source_nodes).",
    )
    evidence_passages: int = Field(
        default=3,
        ge=0,
        le=20,
        description="How many passages of the sources a RAG answer carries as its evidence "
        "(rag.evidence): the sentences, with the next one of their source, that best support an answer, by their "
        "cosine to the question and the question's terms they hold (ragserve.rag.evidence). 0: none.",
    )
    evidence_in_prompt: int = Field(
        default=1,
        ge=0,
        le=5,
        description="Repeat this many of the answer's evidence passages after the sources, right before the "
        "question ('The passage that best answers the question'), when the window has room: a small model answers "
        "from the sentence that holds the fact instead of a neighbouring one (docs/quality.md). 0: off.",
    )
    answerability: bool = Field(
        default=True,
        description="Answer 'the indexed documents do not cover this question' (with the closest "
        "sources, X-RAG-Reason: not_covered, rag.answerable false) instead of calling the model when the relevant "
        "sources are too weak to answer: none holds every query term or reaches answerable_threshold, and the "
        "question names something the index never mentions ('PostgreSQL', 'CORS') or the sources "
        "mention too little of it (answerable_coverage) and no passage supports an answer (answerable_evidence). "
        "Off: every request with a relevant source is answered by the model (docs/quality.md).",
    )
    answerable_threshold: float = Field(
        default=0.7,
        ge=-1.0,
        le=1.0,
        description="A best source with at least this cosine score is always answered (the second "
        "threshold, above similarity_threshold, below which chat passes through as no_context).",
    )
    answerable_coverage: float = Field(
        default=0.62,
        ge=0.0,
        le=1.0,
        description="Answered when the sources' sentences hold this share of the question's terms, "
        "each weighted by its rarity among them (a name the sources never mention weighs most).",
    )
    answerable_evidence: float = Field(
        default=0.65,
        ge=0.0,
        le=1.0,
        description="Answered when a passage of the sources has at least this evidence score (0..1: "
        "its cosine to the question and the question's terms it holds; not what the question asks for, "
        "a number or a command), as a paraphrase may.",
    )

    # --- the answer cache (docs/architecture.md §4, "Answer cache") ----------------------------------
    answer_cache: bool = Field(
        default=True,
        description="Keep whole RAG answers (and their sources) in each ingress replica and answer a repeated "
        "question from them, never after a write to an index it searched (X-RAG-Cache: hit|miss|bypass). "
        "A request opts out with cache: false or Cache-Control: no-store.",
    )
    answer_cache_max_entries: int = Field(default=10_000, ge=1, description="Answers kept per replica (LRU).")
    answer_cache_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes of answers kept per replica (each counted as its serialised answer and sources); "
        "the least recently used go first, and an answer larger than this is not kept.",
    )
    answer_cache_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds an answer is kept at most. Writes invalidate at once; this bounds what no write "
        "shows (a remote model replaced under the same name).",
    )
    answer_cache_similarity: float | None = Field(
        default=None,
        ge=0.9,
        le=1.0,
        description="Also answer a question whose embedding has at least this cosine with a kept one's, all else "
        "equal (0.97: 'What does KAITO automate?' and 'what does kaito automate'). None: only the same question "
        "(whitespace aside) is a hit.",
    )
    answer_cache_sampled: bool = Field(
        default=False,
        description="Cache answers sampled with temperature > 0 too. Off: such a request is answered afresh "
        "(X-RAG-Cache: bypass) unless it sends cache: true.",
    )

    # --- token budget (docs/architecture.md §5) -----------------------------------------------------
    context_token_ratio: float = Field(default=0.5, ge=0.2, le=0.8)
    history_min_messages: int = Field(default=0, ge=0)
    history_max_messages: int = Field(default=200, ge=0)
    budget_safety_ratio: float | None = Field(
        default=None,
        gt=0,
        le=1.0,
        description="Share of the free budget filled. None: 1.0 with an exact tokenizer, 0.8 if approximate.",
    )
    chat_context_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens of sources a chat request without top_k may carry (never more than "
        "context_token_ratio of the window); it retrieves about this divided by chunk_size candidates, at least 5. "
        "None: what the engine can afford: on an engine that measures its prefill speed (the embedded "
        "transformers engine, at start) what it reads in chat_context_prefill_s; on vLLM or a remote server, "
        "the window's share. A request's top_k gets what it asks for, within the window.",
    )
    chat_context_prefill_s: float = Field(
        default=2.0,
        gt=0,
        description="Seconds the sources of a chat request without top_k may take to prefill on an "
        "engine that measures its speed (the embedded CPU engine; never more than half of llm_timeout_s, "
        "never less than 3 chunks of chunk_size): an answer then takes about this plus its own tokens' time.",
    )

    # --- access and limits (every limit is a clear 4xx) ---------------------------------------
    api_keys: list[SecretStr | ScopedKey] | None = Field(
        default=None,
        description="Bearer keys accepted on every route but /health and /metrics: a bare key has "
        "full access, {key, indexes, role} is scoped. None: open (only allowed on the loopback, see "
        "allow_unauthenticated).",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve without api_keys on an address other than the loopback. Off: such a "
        "deployment refuses to start, so an index is never open to a network by accident.",
    )
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="Request body size (413).")
    max_file_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1,
        description="One file uploaded to the OpenAI Files API (POST /v1/files; 413 past it, checked while "
        "it streams to disk). Its request may exceed max_request_bytes by this much, and that route's only.",
    )
    max_documents_per_request: int = Field(default=1000, ge=1, description="Documents per /index or update call.")
    max_document_chars: int = Field(default=1_000_000, ge=1, description="Characters of one document's text.")
    max_embedding_input_tokens: int = Field(
        default=8192,
        ge=1,
        description="Tokens of one /v1/embeddings input (400 past it, before anything is embedded): OpenAI's "
        "bound. The model embeds only its first max_seq_length tokens (256 for all-MiniLM-L6-v2) and usage "
        "counts those.",
    )
    max_embedding_request_tokens: int = Field(
        default=300_000, ge=1, description="Tokens of all of one /v1/embeddings request's inputs (400): OpenAI's."
    )
    max_file_text_chars: int = Field(
        default=20_000_000,
        ge=1,
        description="Characters of text one uploaded or attached file may convert to (413, file_too_large, "
        "before any of it is embedded): ~5 M tokens, OpenAI's bound on a vector store file. Embedding is "
        "the cost: on two CPU cores ~45 s a megabyte of prose, so the default is still ~15 min of one job runner. "
        "The cost follows tokens, not characters: text dense in tokens (runs of punctuation, CJK, symbols) "
        "embeds about 4 times slower a megabyte; usage meters it as embedding_tokens, which a key's "
        "tokens_per_day bounds.",
    )
    max_unpacked_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="What an uploaded or ingested Office file (DOCX, PPTX: zip archives) may "
        "unpack to, by its zip directory, checked before it is unpacked (413); it also may not unpack to more "
        "than 100 times its size.",
    )
    max_convert_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Time one uploaded file's conversion may take; it runs in a process of its "
        "own, stopped after this (422, conversion_timeout).",
    )
    max_convert_memory_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        ge=64 * 1024 * 1024,
        description="Memory one uploaded file's conversion may take beyond what its process "
        "starts with (its address space is bounded; 413).",
    )
    max_concurrent_conversions: int | None = Field(
        default=None,
        ge=1,
        description="Uploaded files converted at once (each a process of its own, on threads of their "
        "own); an upload that finds them all busy for a few seconds is a 503 with Retry-After. None: the "
        "cores this process may use.",
    )
    max_chat_messages: int = Field(default=1000, ge=1, description="Messages in one chat completion request.")
    max_content_parts: int = Field(
        default=4096,
        ge=1,
        description="Content parts (text, image_url, ...) of all the messages of one chat completion request.",
    )
    max_top_k: int = Field(default=100, ge=1, le=1000, description="Largest top_k / max_node_count.")
    max_list_limit: int = Field(default=100, ge=1, le=MAX_LIST_PAGE, description="Largest page of a document listing.")

    # --- ingestion jobs (POST /jobs, vector store files: ragserve.jobs, docs/architecture.md §8c) ---
    job_concurrency: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Job items (batches of documents, vector store files) indexed at once. One keeps most "
        "of the embedder and the shards for queries while a large job runs; more finish jobs sooner.",
    )
    job_batch_documents: int = Field(
        default=64, ge=1, le=1000, description="Documents of a POST /jobs job indexed as one item (one batch)."
    )
    max_documents_per_job: int = Field(
        default=20_000, ge=1, description="Documents one POST /jobs may hold (its body: max_request_bytes)."
    )
    job_lease_s: float = Field(
        default=300.0,
        gt=0,
        description="How long an item may run without renewing its lease before another runner may take it back.",
    )
    job_webhook_url: str | None = Field(
        default=None,
        description="Where a job that ends is announced (POST, JSON, Standard Webhooks signature); None: no webhook.",
    )
    job_webhook_secret: SecretStr | None = Field(
        default=None,
        description="The webhook signing secret (whsec_<base64>, as OpenAI's webhooks use; any other string is "
        "used as it is). Needed with job_webhook_url.",
    )

    @field_validator("api_keys")
    @classmethod
    def _no_empty_keys(cls, keys: list[SecretStr | ScopedKey] | None) -> list[SecretStr | ScopedKey] | None:
        if keys is not None and any(not (k.key if isinstance(k, ScopedKey) else k).get_secret_value() for k in keys):
            raise ValueError("api_keys must not contain empty strings")
        secrets = [(k.key if isinstance(k, ScopedKey) else k).get_secret_value() for k in keys or []]
        first = {secret: i for i, secret in reversed(list(enumerate(secrets)))}
        twice = [i for i, secret in enumerate(secrets) if first[secret] != i]
        if twice:
            # one secret with two scopes would get whichever the check met last: say which, never the key
            raise ValueError(
                f"api_keys: each key must be different; the entries at positions {twice} repeat an earlier one"
            )
        names = [k.name for k in keys or [] if isinstance(k, ScopedKey) and k.name is not None]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"api_keys: names must be unique (usage is reported by name); repeated: {repeated}")
        reserved = sorted(set(names) & RESERVED_KEY_NAMES)
        if reserved:
            raise ValueError(f"api_keys: the names {reserved} are reserved for keys without a name or without keys")
        return keys or None

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError("chunk_overlap must be smaller than chunk_size")
        IndexSpec.parse(self.faiss_index_kind, self.faiss_index_params)  # names what the kind takes
        if self.llm_in_ingress is None:
            self.llm_in_ingress = self.llm_engine == "openai"
        elif self.llm_in_ingress and self.llm_engine != "openai":
            raise ValueError("llm_in_ingress is for the remote 'openai' engine; a local model needs its own deployment")
        if self.prompt_format != "auto" and self.llm_engine != "transformers":
            raise ValueError(
                "prompt_format applies to the transformers engine; vLLM and remote servers apply "
                "the model's chat template themselves"
            )
        if self.job_webhook_url is not None:
            validate_webhook_url(self.job_webhook_url)
            if self.job_webhook_secret is None:
                raise ValueError("job_webhook_url needs job_webhook_secret: a webhook is always signed")
            webhook_key(self.job_webhook_secret.get_secret_value())
        if self.llm_engine == "openai" and not self.llm_url:
            raise ValueError("llm_engine 'openai' needs llm_url (or RAGSERVE_LLM_URL)")
        # Resolve where the config is read: replicas may run with another working directory.
        self.storage_dir = str(Path(self.storage_dir).expanduser().resolve())
        if self.model_cache_dir:
            self.model_cache_dir = str(Path(self.model_cache_dir).expanduser().resolve())
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first: RAGSERVE_<FIELD> wins over the config file's args (docs/architecture.md §3).
        return env_settings, init_settings, dotenv_settings, file_secret_settings


def secret(value: SecretStr | None) -> str | None:
    """The clear value of an optional secret, for the one call that sends it."""
    return value.get_secret_value() if value is not None else None
