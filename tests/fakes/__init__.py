"""Fakes of the systems ragserve talks to, for unit and integration tests."""
