"""Every Kubernetes manifest parses, and holds what dlscale relies on: its image, its command
and arguments, the ports, the volume mounts, the resources, the Secret the database URL and
the Ray token come from; a non-root user for training, and for the service the root and the
privilege its job sandbox needs (each job then runs as an unprivileged uid of its own)."""

from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from dlscale import __version__
from dlscale.cli.main import app

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
IMAGE = f"dlscale:{__version__}"


def documents(name: str) -> dict[str, dict]:
    """kind/name -> manifest."""
    found = {}
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc
        found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def containers(pod_spec: dict) -> list[dict]:
    return pod_spec["containers"]


def check_container(container: dict, pod_spec: dict, sandboxes_jobs: bool = False) -> None:
    assert container["image"] == IMAGE  # the image `make image` builds
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert limits["cpu"] and limits["memory"] and requests["cpu"] and requests["memory"]
    security = pod_spec["securityContext"]
    if sandboxes_jobs:  # `dlscale serve`: root in its container, to drop each job to its own uid
        assert security["runAsUser"] == 0 and container["securityContext"]["privileged"] is True
    else:
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001  # the image's
    volumes = {v["name"] for v in pod_spec.get("volumes", [])}
    assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes


def test_every_manifest_parses():
    assert sorted(p.name for p in K8S.glob("*.yaml")) == ["ray-cluster.yaml", "service.yaml"]


def test_the_service_runs_dlscale_serve_on_its_volume_with_the_database_secret():
    docs = documents("service.yaml")
    deployment = docs["Deployment/dlscale"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = containers(pod)
    check_container(container, pod, sandboxes_jobs=True)
    assert container["command"] == ["dlscale", "serve"]
    args = container["args"]
    # Every option given is one `dlscale serve` has.
    serve = get_command(app).commands["serve"]
    known = {opt for param in serve.params for opt in param.opts}
    assert {a for a in args if a.startswith("--")} <= known
    assert args[args.index("--host") + 1] == "0.0.0.0" and "--allow-remote" in args
    assert args[args.index("--db") + 1] == "$(DLSCALE_DB_URL)"
    (env,) = container["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "dlscale-db", "key": "url"}
    assert "url" in docs["Secret/dlscale-db"]["stringData"]
    port = int(args[args.index("--port") + 1])
    assert container["ports"][0]["containerPort"] == port
    assert container["readinessProbe"]["httpGet"]["path"] == "/api/health"
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    claim = pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for k, d in docs.items() if k.startswith("Persistent")}
    assert (
        deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    )
    service = docs["Service/dlscale"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_training_runs_on_a_kuberay_cluster_with_dlscale_train_cluster_ray():
    docs = documents("ray-cluster.yaml")
    cluster = docs["RayCluster/dlscale"]["spec"]
    assert cluster["rayVersion"] == "2.60.0"  # what constraints.txt pins
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [
        group["template"]["spec"] for group in cluster["workerGroupSpecs"]
    ]
    for pod in pods:
        for container in containers(pod):
            check_container(container, pod)
            names = {e["name"] for e in container["env"]}
            assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} <= names  # token authentication
            assert {"name": "runs", "mountPath": "/data"} in container["volumeMounts"]
    job_pod = docs["Job/dlscale-train"]["spec"]["template"]["spec"]
    (train,) = containers(job_pod)
    check_container(train, job_pod)
    command = train["command"]
    assert command[:2] == ["dlscale", "train"] and command[command.index("--cluster") + 1] == "ray"
    head = command[command.index("--address") + 1]
    assert head == f"{docs['RayCluster/dlscale']['metadata']['name']}-head-svc:6379"  # KubeRay's
    spec_path = Path(command[2])
    mount = next(m for m in train["volumeMounts"] if m["mountPath"] == str(spec_path.parent))
    config_map = next(v for v in job_pod["volumes"] if v["name"] == mount["name"])["configMap"]
    spec_text = docs[f"ConfigMap/{config_map['name']}"]["data"][spec_path.name]
    from dlscale.jobspec import parse_spec

    spec = parse_spec(yaml.safe_load(spec_text))  # the spec the Job trains is valid
    assert spec.strategy.name == "ddp"
    shared = docs["PersistentVolumeClaim/dlscale-runs"]["spec"]["accessModes"]
    assert shared == ["ReadWriteMany"]  # every node writes the run's folder at one path


@pytest.mark.parametrize("name", ["service.yaml", "ray-cluster.yaml"])
def test_no_manifest_carries_a_real_secret(name):
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        if doc["kind"] == "Secret":
            values = " ".join(doc["stringData"].values())
            assert "change-me" in values or values.startswith("sqlite:")
