"""Everything that loads weights or a tokenizer (docs/architecture.md §9): the generation engines
behind one interface (``engine.GenerationEngine``: the embedded transformers engine, the CPU
default; vLLM on a GPU; a remote OpenAI-compatible server), their prompt formats and stop rules,
the embedding model (``embeddings``), the cross-encoder reranker, the token counters and the
table of context windows. The engine modules are imported only when used
(``ragserve.service.engine_factory`` picks one), and nothing here knows the RAG prompt: the chat
service says what a request needs (``SamplingParams.grounded``)."""
