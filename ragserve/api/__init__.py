"""Every shape that crosses a boundary (docs/architecture.md §2, §8): the OpenAI-compatible wire
models (``openai``), the KAITO-style document API and the retrieval vocabulary (``documents``), the
error shapes (``errors``), what free-form fields accept (``values``), sampling parameters
(``sampling``), the chat message (``messages``), a model's output (``generation``), index stats and
FAISS index kinds. Pydantic and the standard library only: every other floor may use them."""
