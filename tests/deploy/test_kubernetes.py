"""deploy/kubernetes/: every manifest validates against the Kubernetes OpenAPI schemas (strict:
unknown fields are errors) of an older and the newest Kubernetes that kubernetes-validate ships,
and the pieces agree with each other, with the image and with the server (no cluster needed)."""

import copy
import re
from pathlib import Path

import pytest

from flint_backend.serving.configure import build_parser, engine_instance_group
from flint_backend.serving.metrics import GAUGES

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
ADAPTER_VALUES = DEPLOY / "prometheus-adapter" / "values.yaml"  # Helm values, not a Kubernetes object
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if p != ADAPTER_VALUES)
KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.utils.latest_version())
HF_CACHE = "/root/.cache/huggingface"  # the image's (root's) Hugging Face cache


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str) -> dict:
    (doc,) = [d for d in documents(path) if d["kind"] == kind]
    return doc


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


DEPLOYMENTS = {p.name: one(p, "Deployment") for p in (DEPLOY / "deployment.yaml",
                                                      DEPLOY / "variants" / "deployment-node-gpus.yaml")}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_validates_against_the_kubernetes_schemas(path, version):
    for doc in documents(path):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{path.relative_to(ROOT)}: {doc['kind']}/{doc['metadata']['name']} at {where}: {error.message}")


def test_kubectl_apply_of_the_folder_makes_the_default_set():
    kinds = sorted(d["kind"] for p in DEPLOY.glob("*.yaml") for d in documents(p))
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Service"]


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_service_hpa_and_probes_fit_each_deployment_variant(name):
    deployment, c = DEPLOYMENTS[name], container(DEPLOYMENTS[name])
    service, hpa = one(DEPLOY / "service.yaml", "Service"), one(DEPLOY / "hpa.yaml", "HorizontalPodAutoscaler")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}  # docker_entrypoint.sh's defaults
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    for probe, path in (("startupProbe", "/v2/health/ready"), ("readinessProbe", "/v2/health/ready"),
                        ("livenessProbe", "/v2/health/live")):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"]) and annotations["prometheus.io/path"] == "/metrics"
    exit_timeout = int(re.search(r"--exit-timeout-secs=(\d+)", env(c)["TRITONSERVER_ARGS"]).group(1))
    assert exit_timeout < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_args_are_configure_flags_with_one_engine_per_gpu_of_the_pod(name, monkeypatch):
    import torch

    c = container(DEPLOYMENTS[name])
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus
    args = build_parser().parse_args(c["args"])  # unknown flags would exit
    assert args.model_positional and args.gpus == "all" and args.kernel_backend == "triton"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)  # the GPUs the pod shows
    ids = ", ".join(str(i) for i in range(gpus))
    assert engine_instance_group(args, args.device or "auto") == \
        f"instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ {ids} ] }} ]"


def test_variants_differ_only_in_gpus_resources_and_checkpoint_volume():
    def without_differences(deployment):
        d = copy.deepcopy(deployment)
        spec = d["spec"]["template"]["spec"]
        del spec["containers"][0]["resources"]
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in ("hf-cache", "dshm")]
        return d

    default, node = DEPLOYMENTS["deployment.yaml"], DEPLOYMENTS["deployment-node-gpus.yaml"]
    assert without_differences(default) == without_differences(node)
    assert container(default)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container(node)["resources"]["limits"]["nvidia.com/gpu"] > 1


def test_every_pod_mounts_the_hugging_face_cache_where_the_image_reads_it():
    claim = one(DEPLOY / "hf-cache-pvc.yaml", "PersistentVolumeClaim")["metadata"]["name"]
    job = one(DEPLOY / "setup" / "hf-cache-download-job.yaml", "Job")
    pods = {**{n: d["spec"]["template"]["spec"] for n, d in DEPLOYMENTS.items()}, "job": job["spec"]["template"]["spec"]}
    for name, pod in pods.items():
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "hf-cache"]
        assert mount["mountPath"] == HF_CACHE, name
        (volume,) = [v for v in pod["volumes"] if v["name"] == "hf-cache"]
        if "persistentVolumeClaim" in volume:
            assert volume["persistentVolumeClaim"]["claimName"] == claim, name
        else:
            assert volume["hostPath"]["path"] == HF_CACHE, name
    assert env(pods["job"]["containers"][0])["HF_HUB_OFFLINE"] == "0"  # the one pod that downloads
    for name, deployment in DEPLOYMENTS.items():
        assert container(deployment)["volumeMounts"][0]["readOnly"] is True
        assert env(container(deployment))["HF_HUB_OFFLINE"] == "1"
    images = {container(d)["image"] for d in DEPLOYMENTS.values()} | {pods["job"]["containers"][0]["image"]}
    assert len(images) == 1, images
    assert "/root/.cache/huggingface" in (ROOT / "Dockerfile").read_text()


def test_the_adapter_rules_serve_the_hpa_metrics_from_flint_gauges():
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    served = {}
    for rule in rules:
        series = re.match(r"^([\w:]+)\{", rule["seriesQuery"]).group(1)
        assert series in GAUGES, series  # a metric flint_model publishes, per engine
        name = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]  # the pod's engines folded into one value
        served[name] = series
    hpa = one(DEPLOY / "hpa.yaml", "HorizontalPodAutoscaler")
    wanted = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert wanted and set(wanted) <= set(served), (wanted, served)
    # the schemas take any string here; Kubernetes takes only AverageValue for Pods metrics
    assert all(m["pods"]["target"]["type"] == "AverageValue" for m in hpa["spec"]["metrics"])
