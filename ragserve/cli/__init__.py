"""The ``ragserve`` command line: ingest and sync folders, chat, query, list indexes (``ragserve.cli.main``)."""
