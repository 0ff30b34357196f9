"""kuberay/ manifests validate against the RayService CRD; serveConfigV2 is a valid Serve config
whose args are valid Settings; the manifest is generated from configs/gpu.yaml and not stale."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ragserve.config import Settings

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT.parent / "shared" / "kuberay-crds" / "ray.io_rayservices.yaml"


def _render_module():
    spec = importlib.util.spec_from_file_location("render_manifest", ROOT / "kuberay" / "render_manifest.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rayservice_schema() -> dict[str, Any]:
    if not CRD.exists():
        pytest.skip(f"CRD not found at {CRD}")
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def rayservices() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((ROOT / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "RayService":
                found.append((path.name, doc))
    return found


def check_serve_config(doc: dict[str, Any]) -> None:
    from ray.serve.schema import ServeDeploySchema

    cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(cfg) if hasattr(
        ServeDeploySchema, "model_validate"
    ) else ServeDeploySchema.parse_obj(cfg)
    for app in cfg["applications"]:
        assert app["import_path"] == "ragserve.deployments.builder:build_app"
        Settings(**app["args"])


def test_there_is_a_rayservice() -> None:
    assert [name for name, _ in rayservices()] == ["rayservice.yaml"]


@pytest.mark.parametrize(("name", "doc"), rayservices())
def test_manifest_validates_against_crd(rayservice_schema: dict[str, Any], name: str, doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, rayservice_schema)
    check_serve_config(doc)
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no work on the head
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpu == int(groups["gpu"]["rayStartParams"]["num-gpus"])
    assert cluster["enableInTreeAutoscaling"] is True


def test_manifest_is_generated_from_gpu_config() -> None:
    module = _render_module()
    assert module.main(["--check"]) == 0, "run: python kuberay/render_manifest.py"
    cfg = yaml.safe_load(rayservices()[0][1]["spec"]["serveConfigV2"])
    source = yaml.safe_load((ROOT / "configs" / "gpu.yaml").read_text())
    assert cfg["applications"][0]["deployments"] == source["applications"][0]["deployments"]


def test_broken_copies_fail(rayservice_schema: dict[str, Any]) -> None:
    _, doc = rayservices()[0]
    no_head = copy.deepcopy(doc)
    del no_head["spec"]["rayClusterConfig"]["headGroupSpec"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(no_head, rayservice_schema)
    bad_type = copy.deepcopy(doc)
    bad_type["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "many"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_type, rayservice_schema)
    bad_serve = copy.deepcopy(doc)
    bad_serve["spec"]["serveConfigV2"] = doc["spec"]["serveConfigV2"].replace("num_shards: 4", "num_shards: zero")
    with pytest.raises(ValueError):
        check_serve_config(bad_serve)
    bad_deploy = copy.deepcopy(doc)
    bad_deploy["spec"]["serveConfigV2"] = doc["spec"]["serveConfigV2"].replace(
        "max_ongoing_requests: 256", "max_ongoing_requests: -3"
    )
    with pytest.raises(ValueError):
        check_serve_config(bad_deploy)


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_serve_config_is_valid(config: Path) -> None:
    check_serve_config({"spec": {"serveConfigV2": config.read_text()}})


def test_every_pod_starts_ray_in_high_throughput_mode() -> None:
    """Ray reads the switches when a pod's raylet starts: head and every worker group carry them."""
    from ragserve.deployments.platform import HIGH_THROUGHPUT_VARS

    cluster = rayservices()[0][1]["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert all(env.get(name) == "1" for name in HIGH_THROUGHPUT_VARS), (group.get("groupName", "head"), env)


def test_every_pod_takes_the_api_keys_from_a_secret_and_the_manifest_holds_none() -> None:
    doc = yaml.safe_load((ROOT / "kuberay" / "rayservice.yaml").read_text())
    cluster = doc["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container["env"]}
            ref = env["RAGSERVE_API_KEYS"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "ragserve-api-keys", "key": "api-keys"}
            assert "value" not in env["RAGSERVE_API_KEYS"]
    serve = yaml.safe_load(doc["spec"]["serveConfigV2"])
    for app in serve["applications"]:
        assert "api_keys" not in app["args"] and "allow_unauthenticated" not in app["args"]


def test_the_image_copies_the_package_and_what_it_installs_from() -> None:
    """kuberay/Dockerfile's COPY sources exist (a renamed package left behind fails the image build,
    which nothing here runs), and the package the import path names is among them."""
    sources = []
    for line in (ROOT / "kuberay" / "Dockerfile").read_text().splitlines():
        words = [w for w in line.split() if not w.startswith("--")]
        if words[:1] == ["COPY"]:
            sources += words[1:-1]
    assert sources, "the Dockerfile copies nothing"
    assert [s for s in sources if not (ROOT / s).exists()] == []
    import_path = yaml.safe_load((ROOT / "configs" / "gpu.yaml").read_text())["applications"][0]["import_path"]
    assert import_path.split(".")[0] in sources
