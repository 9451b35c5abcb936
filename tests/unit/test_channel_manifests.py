"""The channel adapters' Kubernetes manifests (deploy/k8s-channels) checked offline, as
the services' are (tests/unit/test_kubernetes_manifests.py): valid against the API's
schemas, what `kubectl kustomize` builds, one pod of the image running `signoff channel
run NAME` with its record on a volume that outlives it, probes on its own port, the
image's user on a read-only root, and only its own keys and secrets from its own Secret."""

import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from shared.keyring import CHANNEL_ADAPTERS, adapter_files
from shared.settings import PROJECT_ROOT
from signoff.adapters.email import EmailSettings
from signoff.adapters.slack import SlackSettings
from tests.unit.test_kubernetes_manifests import KUBERNETES_VERSION, build, identity, load, of_kind, own_container

FOLDER = PROJECT_ROOT / "deploy" / "k8s-channels"
SETTINGS = {"slack": SlackSettings, "email": EmailSettings}


@pytest.fixture(scope="module")
def objects():
    return build(FOLDER)


def test_the_channel_manifests_are_listed_valid_and_what_kubectl_kustomize_builds(objects):
    listed = set(load(FOLDER / "kustomization.yaml")[0]["resources"])
    assert listed == {p.name for p in FOLDER.glob("*.yaml")} - {"kustomization.yaml"}
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (Debian's package) is needed to build the kustomization as Kubernetes tooling does"
    built = subprocess.run([kubectl, "kustomize", str(FOLDER)], capture_output=True, text=True, check=True).stdout
    assert sorted(yaml.safe_load_all(built), key=identity) == sorted(objects, key=identity)


def test_each_adapter_is_one_pod_with_its_record_kept_its_own_keys_and_no_secret_written_down(objects):
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == {f"channel-{name}" for name in CHANNEL_ADAPTERS}
    assert not of_kind(objects, "Secret")
    for name in CHANNEL_ADAPTERS:
        deployment = deployments[f"channel-{name}"]
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
        pod = deployment["spec"]["template"]["spec"]
        container = own_container(deployment)
        assert container["args"] == ["channel", "run", name]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        [keys] = [v["secret"] for v in pod["volumes"] if "secret" in v]
        assert keys["secretName"] == f"signoff-channel-{name}"
        assert {item["path"] for item in keys["items"]} == set(adapter_files(name))
        env = {v["name"]: v for v in container["env"]}
        for variable, entry in env.items():
            assert variable[len("SIGNOFF_") :].lower().split("_", 1)[1] in SETTINGS[name].model_fields, variable
            if re.search(r"KEY|PASSWORD|TOKEN|SECRET|USERNAME", variable):
                assert entry["valueFrom"]["secretKeyRef"]["name"] == f"signoff-channel-{name}", variable
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        state = env[f"SIGNOFF_{name.upper()}_STATE_FILE"]["value"]
        [claim] = [v for v in pod["volumes"] if v["name"] == mounts["/" + state.split("/")[1]]]
        assert claim["persistentVolumeClaim"]["claimName"] in of_kind(objects, "PersistentVolumeClaim")
        port = int(env[f"SIGNOFF_{name.upper()}_PORT"]["value"])
        assert container["ports"] == [{"name": "http", "containerPort": port}]
        assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        users = of_kind(objects, "ConfigMap")[f"{name}-users"]["data"][f"{name}.yaml"]
        assert yaml.safe_load(users) == yaml.safe_load((PROJECT_ROOT / "deploy" / f"{name}.example.yaml").read_text())
