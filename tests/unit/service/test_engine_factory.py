"""Engine selection from the settings, and the local engines' pure helpers (no model loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragserve.config import Settings
from ragserve.errors import BadRequestError
from ragserve.models.openai_engine import OpenAIEngine
from ragserve.models.stops import safe_length, stop_index
from ragserve.models.transformers_engine import TransformersEngine
from ragserve.models.vllm_engine import VLLMEngine
from ragserve.service.engine_factory import make_engine, model_cache_dir


def test_transformers_is_the_default_and_caches_under_storage(tmp_path: Path) -> None:
    engine = make_engine(Settings(storage_dir=str(tmp_path)))
    assert isinstance(engine, TransformersEngine)
    assert engine.cache_dir == tmp_path / "models"
    assert engine.model_id == "gemma-3-270m-q4_k_m"
    assert engine.converted_dir == tmp_path / "models" / "converted" / "gemma-3-270m-q4_k_m"
    custom = Settings(storage_dir=str(tmp_path), model_cache_dir=str(tmp_path / "cache"))
    assert model_cache_dir(custom) == tmp_path / "cache"


def test_prompt_format_setting_reaches_the_transformers_engine(tmp_path: Path) -> None:
    assert make_engine(Settings(storage_dir=str(tmp_path)))._prompt_format_setting == "auto"
    forced = make_engine(Settings(storage_dir=str(tmp_path), prompt_format="chat"))
    assert forced._prompt_format_setting == "chat"
    with pytest.raises(ValueError, match="prompt_format applies to the transformers engine"):
        Settings(storage_dir=str(tmp_path), llm_engine="openai", llm_url="http://llm:8000", prompt_format="completion")


def test_transformers_rejects_unknown_engine_args(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown engine_args"):
        make_engine(Settings(storage_dir=str(tmp_path), llm_engine_args={"tensor_parallel_size": 2}))


def test_openai_engine_from_settings(tmp_path: Path) -> None:
    engine = make_engine(
        Settings(
            storage_dir=str(tmp_path),
            llm_engine="openai",
            llm_url="http://llm:8000",
            llm_model="phi-4",
            llm_api_key="k",
            llm_timeout_s=9,
            context_window=2048,
        )
    )
    assert isinstance(engine, OpenAIEngine)
    assert (engine.base_url, engine.model_id, engine.context_window()) == ("http://llm:8000/v1", "phi-4", 2048)


def test_vllm_engine_needs_a_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="llm_model"):
        make_engine(Settings(storage_dir=str(tmp_path), llm_engine="vllm"))
    engine = make_engine(
        Settings(
            storage_dir=str(tmp_path), llm_engine="vllm", llm_model="org/m", llm_engine_args={"tensor_parallel_size": 2}
        )
    )
    assert isinstance(engine, VLLMEngine) and engine.model_id == "org/m"


def test_stop_helpers() -> None:
    assert stop_index("hello world", ["wor", "lo"]) == 3
    assert stop_index("hello", ["x"]) is None
    assert safe_length("the answer is EN", ["END"]) == len("the answer is ")  # may become END
    assert safe_length("the answer", ["END"]) == len("the answer")
    assert safe_length("caf\ufffd", []) == 3  # an incomplete UTF-8 character waits for its last byte


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "u"}}],
                    }
                ]
            },
            "image_url",
        ),
    ],
)
def test_local_engines_reject_what_they_cannot_serve(body: dict, what: str, tmp_path) -> None:
    with pytest.raises(BadRequestError) as err:
        TransformersEngine(None, tmp_path).check_passthrough({"messages": [{"role": "user", "content": "hi"}], **body})
    assert err.value.status == 400 and err.value.type == "invalid_request_error"
    assert what in err.value.message and "not supported by the embedded transformers engine" in err.value.message


def test_text_only_bodies_pass(tmp_path) -> None:
    TransformersEngine(None, tmp_path).check_passthrough(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "tools": [], "functions": None}
    )
