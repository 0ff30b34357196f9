"""Offline evaluation of a running ragserve server (``ragserve-eval``)."""
