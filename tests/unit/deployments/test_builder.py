"""``build_app``'s deployment options: what a serve config's ``deployments:`` list sets, for code
that deploys without one (the load benchmark's ``--ingress-replicas``). Binding needs no cluster."""

from __future__ import annotations

import inspect

import pytest

from ragserve.deployments.builder import build_app, build_app_with

SETTINGS = {"llm_engine": "openai", "llm_url": "http://127.0.0.1:9/v1"}


def test_options_reach_the_named_deployment_and_no_other() -> None:
    app = build_app_with(SETTINGS, {"Ingress": {"num_replicas": 3, "max_ongoing_requests": 64}})
    ingress = app._bound_deployment
    assert ingress.name == "Ingress" and ingress.num_replicas == 3 and ingress.max_ongoing_requests == 64
    embedder = ingress.init_args[0]._bound_deployment
    assert embedder.name == "Embedder" and embedder.num_replicas == 1


def test_without_options_the_code_defaults_hold() -> None:
    ingress = build_app(SETTINGS)._bound_deployment
    assert ingress.num_replicas == 1 and ingress.max_ongoing_requests == 256


def test_an_unknown_deployment_name_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="Ingres"):
        build_app_with(SETTINGS, {"Ingres": {"num_replicas": 2}})


def test_build_app_takes_exactly_the_one_parameter_serve_calls_a_builder_with() -> None:
    """Serve refuses a builder (a config's ``import_path``) of any other arity: ``serve run`` and
    ``make run`` would fail to deploy."""
    assert len(inspect.signature(build_app).parameters) == 1
