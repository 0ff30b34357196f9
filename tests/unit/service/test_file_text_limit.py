"""``max_file_text_chars``: what one uploaded or attached file may convert to, refused before any
of it is embedded (a file of hundreds of megabytes held the job runner for hours: hostile probe)."""

from __future__ import annotations

import dataclasses

import pytest

from ragserve.config import Settings
from ragserve.errors import PayloadTooLargeError
from ragserve.service.files import convert_file
from ragserve.service.limits import RequestLimits


def limits(most: int) -> RequestLimits:
    base = RequestLimits.from_settings(Settings(llm_engine="openai", llm_url="http://127.0.0.1:9/v1"))
    return dataclasses.replace(base, max_file_text_chars=most, max_document_chars=100)


async def test_a_file_over_its_text_bound_is_a_413_naming_it_and_one_within_is_converted() -> None:
    text = ("A pump is serviced every week. " * 40).encode()  # 1,240 characters: split into 13 documents
    _, docs = await convert_file(limits(2_000), "notes.txt", text, "uploads/notes.txt", None)
    assert len(docs) > 1 and sum(len(d["text"]) for d in docs) <= 2_000
    with pytest.raises(PayloadTooLargeError) as refused:
        await convert_file(limits(1_000), "notes.txt", text, "uploads/notes.txt", None)
    assert refused.value.code == "file_too_large" and refused.value.status == 413
    assert "at most 1000" in refused.value.message and "notes.txt" in refused.value.message


def test_the_default_is_openais_bound_on_a_vector_store_file() -> None:
    assert Settings().max_file_text_chars == 20_000_000  # ~5 M tokens of English
