"""The pure steps of one RAG request (docs/architecture.md §4, §5): ``plan`` (pass through or run
RAG, and the query/history split), ``followup`` (a follow-up's retrieval query), ``fusion`` (dense
and lexical candidates to one ranking), ``rerank`` (the optional rerank step), ``context``
(which sources may be used), ``prompt`` (the RAG prompt), ``fit`` (system, history, sources and
completion into the window, counting real tokens), ``citations`` (the answer's ``[n]`` markers).
No I/O and no models: each is a function of its arguments, testable in milliseconds."""
