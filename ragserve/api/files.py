"""Wire models of the routes for people: file upload and the playground's configuration."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class UploadResponse(BaseModel):
    """What ``POST /indexes/{name}/files`` made of a file."""

    index_name: str
    path: str = Field(description="The metadata path; every document id starts with it.")
    title: str
    file_type: str
    doc_ids: list[str]
    deleted_doc_ids: list[str] = Field(description="Documents of an earlier version of the file that are gone.")
    warnings: list[str]


class UiConfig(BaseModel):
    """``GET /ui/config``: what the playground shows of the server (never a key or a credential)."""

    model: str
    context_window: int
    embedding_model: str
    auth_required: bool
    limits: dict[str, int]
    settings: dict[str, Any]
    features: list[str] = Field(
        default_factory=list,
        description="What this server's document API takes beyond KAITO's: 'if_exists' (POST /index and "
        "/jobs) and 'if_hash_value' (if_hash_value on updates, if_hash_values on deletes).",
    )
