"""The Ray Serve shells (docs/architecture.md §11): ingress, embedder, generator and the shard
actors, each a thin class over ``ragserve.service``; ``builder.build_app`` is every serve config's
``import_path`` and ``platform`` starts Ray for ragserve. The only part of the package that imports
Ray."""
