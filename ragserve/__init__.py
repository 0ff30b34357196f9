"""ragserve: a RAG server on Ray Serve (docs/architecture.md).

The package's parts are floors, read from the bottom up (docs/architecture.md §2): the leaves
(``errors``, ``telemetry``, ``hardware``, ``serve_port``), ``api`` (every shape that crosses a
boundary), ``ports`` (every seam), ``ingest`` and ``store``, ``rag`` and ``models``, ``config``,
``service``, ``http``, then ``deployments`` (the Ray Serve shells) and ``cli``; ``testing`` holds
what tests and benchmarks share. A part imports only from lower floors
(``tests/unit/test_layers.py``), and only ``deployments`` imports Ray. Importing this package
imports nothing else.
"""
