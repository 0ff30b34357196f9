"""The logic behind each route (docs/architecture.md §2, §12): documents (index management),
retrieval, snapshots, chat (the RAG pipeline), embeddings, access and limits, the shard pool and
what a shard serves, and ``wiring.build_services``, the one place they are assembled."""
