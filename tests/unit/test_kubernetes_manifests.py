"""The Kubernetes manifests (deploy/k8s, kustomize) checked offline: every file
parses, the kustomization builds (here, in Python, and as `kubectl kustomize`
builds it), every object is valid against the Kubernetes API's own JSON schemas
(the `kubernetes-validate` package ships them), and the objects agree with each
other and with the image: probes on a declared port, selectors that select,
a PodDisruptionBudget for every replicated service, the image's user and
entrypoint, only settings that exist, and no secret written down."""

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from services.model_step.settings import ModelStepSettings
from services.publisher.settings import PublisherSettings
from services.gateway.settings import GatewaySettings
from services.operations.warm_start import SERVICES
from shared.keyring import HELD_BY
from shared.settings import PROJECT_ROOT

K8S = PROJECT_ROOT / "deploy" / "k8s"
# The oldest Kubernetes the manifests are checked against (still supported upstream).
KUBERNETES_VERSION = "1.31.0"
# The metrics endpoint's settings (served on every service's metrics port).
METRICS_SETTINGS = {"metrics_host", "metrics_port"}
# What each service holds in its keys folder (shared/keyring.py's table, Settings.*_password_file).
KEYS = {service: set(files) for service, files in HELD_BY.items()}
# Two ledgers and two publishers: a replica takes over at once (docs/design.md, "Deploying").
MIN_REPLICAS = {"approval-ledger": 2, "publisher": 2, "model-step": 1, "tool-executor": 1, "gateway": 2}
# Ports beyond the metrics port: the gateway's API.
EXTRA_PORTS = {"gateway": {"http": 8080}}
CLUSTER_WIDE = {"Namespace"}


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def build(folder: Path) -> list[dict]:
    """What `kustomize build` makes of the features this kustomization uses:
    resources (files, or folders with their own kustomization), namespace, images."""
    [kustomization] = load(folder / "kustomization.yaml")
    unknown = set(kustomization) - {"apiVersion", "kind", "namespace", "resources", "images"}
    assert not unknown, f"this builder does not know {unknown}: teach it, or the check below is not of what applies"
    objects = []
    for resource in kustomization["resources"]:
        path = folder / resource
        objects += build(path) if path.is_dir() else load(path)
    for obj in objects:
        if "namespace" in kustomization and obj["kind"] not in CLUSTER_WIDE:
            obj["metadata"]["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        for container in containers(objects):
            name, _, _ = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return objects


def containers(objects):
    return [c for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]]


def own_container(deployment) -> dict:
    """The container that runs the deployment's service (the executor's pod also runs the tool launcher)."""
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                   if c["name"] == deployment["metadata"]["name"]]
    return container


def of_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels selectors are checked here"
    return selector["matchLabels"].items() <= labels.items()


def identity(obj) -> tuple:
    return obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


@pytest.fixture(scope="module")
def objects():
    return build(K8S)


def test_every_manifest_parses_and_the_kustomization_lists_every_one(objects):
    listed = set(load(K8S / "kustomization.yaml")[0]["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, "a manifest the kustomization leaves out is never applied"
    for obj in objects:
        assert isinstance(obj, dict) and obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"]
    assert len({identity(o) for o in objects}) == len(objects), "two objects of one kind share a name"


def test_the_python_build_is_what_kubectl_kustomize_builds(objects):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (Debian's package) is needed to build the kustomization as Kubernetes tooling does"
    built = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout
    assert sorted(yaml.safe_load_all(built), key=identity) == sorted(objects, key=identity)


def test_every_object_is_valid_against_the_kubernetes_api_schema(objects):
    kinds = set()
    for obj in objects:
        # strict: a misspelt or misplaced field is an error, not silently dropped by the API server.
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        kinds.add(obj["kind"])
    assert kinds == {"Namespace", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget"}


def test_the_schema_check_catches_a_misspelt_field(objects):
    deployment = of_kind(objects, "Deployment")["approval-ledger"]
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_each_service_is_one_deployment_of_the_image_running_that_service_with_its_replicas(objects):
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == set(SERVICES)
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    image_name = compose["services"]["approval-ledger"]["image"].partition(":")[0]
    dockerfile = (PROJECT_ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["signoff"\]', dockerfile, re.M), "the args below assume `signoff` is the entrypoint"
    for name, deployment in deployments.items():
        assert deployment["spec"]["replicas"] >= MIN_REPLICAS[name], name
        container = own_container(deployment)
        assert {c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]} == \
            {name} | ({"tool-launcher"} if name == "tool-executor" else set()), name
        assert container["image"].partition(":")[0] == image_name, f"{name} runs another image than compose builds"
        assert container["args"] == ["run", name] and "command" not in container


def test_probes_hit_the_health_endpoints_on_the_declared_metrics_port(objects):
    settings = of_kind(objects, "ConfigMap")["signoff-settings"]["data"]
    port = int(settings["SIGNOFF_METRICS_PORT"])
    assert settings["SIGNOFF_METRICS_HOST"] == "0.0.0.0", "a probe from the kubelet must reach the pod's address"
    for name, deployment in of_kind(objects, "Deployment").items():
        template = deployment["spec"]["template"]
        container = own_container(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"metrics": port, **EXTRA_PORTS.get(name, {})}, name
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert container[probe]["httpGet"]["port"] in ports, f"{name}'s {probe} names an undeclared port"
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == port


def test_selectors_select_their_pods_and_every_replicated_service_has_one_disruption_budget(objects):
    deployments = of_kind(objects, "Deployment")
    budgets = of_kind(objects, "PodDisruptionBudget")
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"], labels), f"{name}'s selector misses its own pods"
        others = [n for n, d in deployments.items() if n != name]
        assert not any(selects(deployment["spec"]["selector"], deployments[n]["spec"]["template"]["metadata"]["labels"])
                       for n in others), f"{name}'s selector also takes another service's pods"
        for spread in deployment["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
            assert selects(spread["labelSelector"], labels)
        covering = [b for b in budgets.values() if selects(b["spec"]["selector"], labels)]
        if deployment["spec"]["replicas"] > 1:
            assert len(covering) == 1, f"{name} has {deployment['spec']['replicas']} replicas and {len(covering)} budgets"
            assert covering[0]["spec"]["minAvailable"] < deployment["spec"]["replicas"], "a budget that blocks every drain"
    for name, budget in budgets.items():
        assert sum(selects(budget["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
                   for d in deployments.values()) == 1, f"budget {name} does not cover exactly one service"
    metrics = of_kind(objects, "Service")["signoff-metrics"]
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert metrics["spec"]["selector"].items() <= labels.items(), f"the metrics Service misses {name}"
        container = own_container(deployment)
        assert metrics["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}


def test_pods_run_as_the_images_user_without_privileges_on_a_read_only_root(objects):
    uid = int(re.search(r"useradd .*--uid (\d+)", (PROJECT_ROOT / "deploy" / "Dockerfile").read_text())[1])
    for name, deployment in of_kind(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == uid, name
        container = own_container(deployment)
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False, name
        assert context["capabilities"]["drop"] == ["ALL"]
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        settings = of_kind(objects, "ConfigMap")["signoff-settings"]["data"]
        assert {settings["SIGNOFF_DATA_DIR"], settings["SIGNOFF_KEYS_DIR"], "/tmp"} <= mounted, \
            f"{name} writes where the read-only root would refuse"
        for resource in ("cpu", "memory"):
            assert container["resources"]["requests"][resource] and container["resources"]["limits"][resource], name


def test_each_service_gets_only_its_own_keys_from_its_own_secret_and_no_secret_is_written_down(objects):
    assert not [o for o in objects if o["kind"] == "Secret"], "Secrets are made from `signoff setup`'s keys, not kept here"
    for name, deployment in of_kind(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        [keys] = [v["secret"] for v in pod["volumes"] if "secret" in v]
        assert keys["secretName"] == f"signoff-{name}"
        assert {item["path"] for item in keys["items"]} == KEYS[name], name
        container = own_container(deployment)
        for variable in container.get("env", []):
            if re.search(r"KEY|PASSWORD|TOKEN|SECRET", variable["name"]):
                assert "value" not in variable and variable["valueFrom"]["secretKeyRef"]["name"] == f"signoff-{name}"
    for value in of_kind(objects, "ConfigMap")["signoff-settings"]["data"].values():
        assert not re.search(r"://[^/@\s]*:[^/@\s]*@", value), f"a credential in the ConfigMap: {value}"


def test_every_setting_set_is_one_a_service_reads(objects):
    known = (set(ModelStepSettings.model_fields) | set(PublisherSettings.model_fields) | METRICS_SETTINGS
             | set(GatewaySettings.model_fields))
    given = set(of_kind(objects, "ConfigMap")["signoff-settings"]["data"])
    for deployment in of_kind(objects, "Deployment").values():
        given |= {v["name"] for v in own_container(deployment).get("env", [])}
    unread = {name for name in given if not name.startswith("SIGNOFF_") or name[8:].lower() not in known}
    assert not unread, f"settings no service reads (misspelt?): {unread}"


def test_the_executor_starts_python_tools_through_a_root_launcher_beside_it_that_holds_nothing_else(objects):
    """A python tool never runs as the executor's user (docs/design.md, "Trust boundaries"):
    the executor's pod runs the tool launcher as a second container, the only root one,
    with no key, no setting and only the capabilities to switch users, kill and chown;
    the two share only the launcher's socket, the executor read-only."""
    deployment = of_kind(objects, "Deployment")["tool-executor"]
    pod = deployment["spec"]["template"]["spec"]
    executor = own_container(deployment)
    [launcher] = [c for c in pod["containers"] if c["name"] == "tool-launcher"]
    assert not pod.get("shareProcessNamespace"), "the tools would see the executor's processes"
    socket = {v["name"]: v["value"] for v in executor["env"]}["SIGNOFF_TOOL_LAUNCHER"]
    shared = {m["name"] for m in executor["volumeMounts"]} & {m["name"] for m in launcher["volumeMounts"]}
    assert shared == {"launcher"}, "the executor and the launcher share the socket's folder and nothing else"
    [in_executor] = [m for m in executor["volumeMounts"] if m["name"] == "launcher"]
    [in_launcher] = [m for m in launcher["volumeMounts"] if m["name"] == "launcher"]
    assert in_executor["readOnly"] is True and in_executor["mountPath"] == in_launcher["mountPath"]
    assert socket.startswith(in_launcher["mountPath"] + "/")
    [volume] = [v for v in pod["volumes"] if v["name"] == "launcher"]
    assert volume == {"name": "launcher", "emptyDir": {}}
    options = dict(zip(launcher["args"][1::2], launcher["args"][2::2], strict=True))
    assert launcher["args"][0] == "tool-launcher" and "command" not in launcher
    dockerfile = (PROJECT_ROOT / "deploy" / "Dockerfile").read_text()
    image_user = re.search(r"useradd --create-home --uid (\d+) (\S+)", dockerfile)[2]
    assert options["--socket"] == socket and options["--client"] == image_user
    assert "env" not in launcher and "envFrom" not in launcher, "the launcher is told no setting"
    assert {m["name"] for m in launcher["volumeMounts"]} == {"launcher", "tool-data", "tool-tmp"}, "no key"
    context = launcher["securityContext"]
    assert context["runAsUser"] == 0 and context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"]["add"]) <= {"SETUID", "SETGID", "KILL", "CHOWN"}
    # Every other container of every pod runs as the image's user, without privileges.
    for other in of_kind(objects, "Deployment").values():
        for container in other["spec"]["template"]["spec"]["containers"]:
            if container is not launcher:
                assert "runAsUser" not in container.get("securityContext", {}), container["name"]


def test_the_cluster_overlay_adds_the_operators_clusters_and_points_the_services_at_them(objects):
    """deploy/k8s-cluster: the base unchanged but for its two URLs, plus a RabbitmqCluster of
    three nodes that pause when cut off and a CloudNativePG Cluster with a synchronous standby
    (what tests/cluster measured: without one, a failover forgets acknowledged work)."""
    built = subprocess.run([shutil.which("kubectl") or "kubectl", "kustomize", str(K8S.parent / "k8s-cluster")],
                           capture_output=True, text=True, check=True).stdout
    overlay = list(yaml.safe_load_all(built))
    added = {identity(o) for o in overlay} - {identity(o) for o in objects}
    assert {kind for kind, *_ in added} == {"RabbitmqCluster", "Cluster"}, added
    [rabbitmq] = [o for o in overlay if o["kind"] == "RabbitmqCluster"]
    [postgres] = [o for o in overlay if o["kind"] == "Cluster"]
    assert rabbitmq["spec"]["replicas"] == 3
    assert "cluster_partition_handling = pause_minority" in rabbitmq["spec"]["rabbitmq"]["additionalConfig"]
    assert postgres["apiVersion"].startswith("postgresql.cnpg.io/") and postgres["spec"]["instances"] >= 2
    assert postgres["spec"]["minSyncReplicas"] >= 1
    settings = of_kind(overlay, "ConfigMap")["signoff-settings"]["data"]
    assert settings["SIGNOFF_RABBITMQ_URL"] == f"amqp://{rabbitmq['metadata']['name']}:5672/"
    assert settings["SIGNOFF_DATABASE_URL"].startswith(f"postgresql://{postgres['metadata']['name']}-rw:5432/")
    base = of_kind(objects, "ConfigMap")["signoff-settings"]["data"]
    assert {k: v for k, v in settings.items() if not k.endswith("_URL")} == {
        k: v for k, v in base.items() if not k.endswith("_URL")}
    assert all(o["metadata"].get("namespace") == "signoff" for o in overlay if o["kind"] != "Namespace")
