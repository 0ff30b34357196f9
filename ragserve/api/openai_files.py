"""OpenAI Files API wire models (``/v1/files``), shaped as OpenAI's reference so the official SDKs
parse them unchanged: ``FileObject``, the list page ``FileList`` and ``FileDeleted``.

The stored record behind a ``FileObject`` (its sha256, where its bytes lie) is the file store's
(``ragserve.service.file_store``), not part of the wire shape."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, Field

#: The purposes OpenAI defines for an uploaded file. ragserve stores a file of any of them; only
#: ``assistants`` and ``user_data`` mean anything to it (files a vector store may ingest).
FilePurpose = Literal["assistants", "batch", "fine-tune", "vision", "user_data", "evals"]
FILE_PURPOSES: tuple[str, ...] = get_args(FilePurpose)

#: Files per page of ``GET /v1/files``: OpenAI's default and largest ``limit``.
MAX_FILE_PAGE = 10_000

#: The longest file name kept (characters, after cleaning): what most file systems allow.
MAX_FILENAME_CHARS = 255


class FileObject(BaseModel):
    """One uploaded file. ``status`` is always ``processed``: a file is stored whole before its id is
    returned, and is converted later, by whatever reads it (a vector store's ingestion)."""

    id: str = Field(description="file-<24 hex digits>; the first 12 are the upload's time, so ids sort by age.")
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix seconds.")
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of ``GET /v1/files``; the next page is ``?after=<last_id>`` while ``has_more``."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
