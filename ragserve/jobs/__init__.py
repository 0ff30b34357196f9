"""Durable ingestion jobs (issue 25): a SQLite-backed job store, a bounded runner and a signed webhook notifier.

A job is accepted at once with an id, its items run later, at most ``concurrency`` at a time, and
its progress, per-item errors and end state survive a crash of the process. Nothing here knows
Ray, FastAPI or how a document is indexed: the caller hands the runner a handler that does one
item's work, and the contract it relies on is that **an item may run again after a crash, never
twice at the same time, and its result is recorded once** (document ids are deterministic and an
add replaces, so running an item again is harmless).

- :mod:`ragserve.jobs.store`: ``JobStore``, the one source of truth (jobs, items, webhook deliveries).
- :mod:`ragserve.jobs.runner`: ``JobRunner``, claims items and runs the handler on an asyncio loop.
- :mod:`ragserve.jobs.webhook`: ``WebhookNotifier``, delivers Standard Webhooks-signed job events.
"""
