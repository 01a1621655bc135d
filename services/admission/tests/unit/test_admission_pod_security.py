"""A job's pod templates keep to what a namespace shared by tenants allows: the Pod Security
Standards' baseline, the default service account, and no Secret references. Each refusal names the
field's path from the job spec's root and says why."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.admission.domain.pod_security import shared_namespace_errors
from tessera.admission.domain.templates import job_template_errors
from tessera.admission.service_layer.handlers import submit_job
from tessera.contracts.jobs import JobSpec
from tessera.testing.builders import a_job

PREFIX = "pod_groups[0].template"
TENANT = "team"
SPEC = f"{PREFIX}.spec"
C0 = f"{SPEC}.containers[0]"
EXAMPLES = Path(__file__).parents[4] / "examples" / "jobs"

ALLOWED: dict[str, Any] = {
    "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/main": "runtime/default"}},
    "spec": {
        "serviceAccountName": "default",
        "securityContext": {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
            "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
            "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
        },
        "initContainers": [{"name": "fetch", "image": "busybox:1.37", "env": [{"name": "A", "value": "1"}]}],
        "containers": [
            {
                "name": "main",
                "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                "securityContext": {
                    "privileged": False,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_CHROOT"], "drop": ["ALL"]},
                    "procMount": "Default",
                    "appArmorProfile": {"type": "RuntimeDefault"},
                },
                "ports": [{"containerPort": 29500}, {"containerPort": 8000, "hostPort": 0}],
                "env": [
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "team-cfg", "key": "k"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "team-cfg"}}],
            }
        ],
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "cfg", "configMap": {"name": "team-cfg"}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        ],
    },
}


def refusals(change: dict[str, Any] | None = None, /, **spec: Any) -> list[str]:
    """The refused fields of ALLOWED with `spec` merged into its spec and `change` into its first
    container."""
    template = copy.deepcopy(ALLOWED)
    template["spec"].update(spec)
    template["spec"]["containers"][0].update(change or {})
    return [e.field for e in shared_namespace_errors(template, PREFIX, TENANT)]


def test_a_template_within_the_baseline_with_no_secret_passes() -> None:
    assert shared_namespace_errors(ALLOWED, PREFIX, TENANT) == []
    assert (
        shared_namespace_errors(
            {"spec": {"containers": [{"name": "m", "image": "nginx:1.27"}]}}, PREFIX, TENANT
        )
        == []
    )


@pytest.mark.parametrize("example", ["ddp-2x4.yaml", "inference-fractional.yaml"])
def test_the_example_jobs_pass(example: str) -> None:
    spec = JobSpec.model_validate(yaml.safe_load((EXAMPLES / example).read_text()))
    assert job_template_errors(spec, required=True) == []


def test_a_privileged_container_is_refused() -> None:
    assert refusals({"securityContext": {"privileged": True}}) == [f"{C0}.securityContext.privileged"]


def test_a_privileged_init_container_is_refused_too() -> None:
    init = [{"name": "i", "image": "busybox:1.37", "securityContext": {"privileged": True}}]
    assert refusals(initContainers=init) == [f"{SPEC}.initContainers[0].securityContext.privileged"]


@pytest.mark.parametrize("namespace", ["hostNetwork", "hostPID", "hostIPC"])
def test_the_hosts_namespaces_are_refused(namespace: str) -> None:
    assert refusals(**{namespace: True}) == [f"{SPEC}.{namespace}"]


def test_a_host_path_volume_is_refused() -> None:
    volumes = [{"name": "root", "hostPath": {"path": "/"}}]
    assert refusals(volumes=volumes) == [f"{SPEC}.volumes[0].hostPath"]


def test_a_capability_beyond_the_baseline_is_refused_and_named() -> None:
    change = {"securityContext": {"capabilities": {"add": ["CHOWN", "SYS_ADMIN", "NET_RAW"]}}}
    (sys_admin, net_raw) = shared_namespace_errors(
        {"spec": {"containers": [{"name": "m", "image": "x:1", **change}]}}, PREFIX, TENANT
    )
    assert (sys_admin.field, net_raw.field) == (
        f"{C0}.securityContext.capabilities.add[1]",
        f"{C0}.securityContext.capabilities.add[2]",
    )
    assert sys_admin.reason.startswith("SYS_ADMIN is not among the baseline's capabilities")
    assert "namespace that tenants share" in sys_admin.reason


def test_a_host_port_is_refused() -> None:
    ports = [{"containerPort": 8000}, {"containerPort": 22, "hostPort": 22}]
    assert refusals({"ports": ports}) == [f"{C0}.ports[1].hostPort"]


@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_a_service_account_but_the_default_is_refused(field: str) -> None:
    assert refusals(**{field: "tessera-admission"}) == [f"{SPEC}.{field}"]
    (error,) = shared_namespace_errors({"spec": {field: "ci", "containers": []}}, PREFIX, TENANT)
    assert "service account's rights" in error.reason


def test_env_from_a_secret_is_refused() -> None:
    env_from = [{"configMapRef": {"name": "team-c"}}, {"secretRef": {"name": "team-b-credentials"}}]
    assert refusals({"envFrom": env_from}) == [f"{C0}.envFrom[1].secretRef"]


def test_an_env_value_from_a_secret_key_is_refused() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    (error,) = shared_namespace_errors(
        {"spec": {"containers": [{"name": "m", "image": "x:1", "env": env}]}}, PREFIX, TENANT
    )
    assert (error.field, error.reason) == (
        f"{C0}.env[1].valueFrom.secretKeyRef",
        "must not name a Secret: admission runs the pods in a namespace that tenants share",
    )


@pytest.mark.parametrize(
    ("volume", "field"),
    [
        ({"name": "s", "secret": {"secretName": "team-b"}}, "secret"),
        (
            {"name": "p", "projected": {"sources": [{"secret": {"name": "team-b"}}]}},
            "projected.sources[0].secret",
        ),
        (
            {"name": "c", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}},
            "csi.nodePublishSecretRef",
        ),
        ({"name": "f", "cephfs": {"monitors": ["m"], "secretRef": {"name": "s"}}}, "cephfs.secretRef"),
        ({"name": "a", "azureFile": {"secretName": "s", "shareName": "x"}}, "azureFile.secretName"),
    ],
)
def test_a_volume_of_or_naming_a_secret_is_refused(volume: dict[str, Any], field: str) -> None:
    assert refusals(volumes=[volume]) == [f"{SPEC}.volumes[0].{field}"]


def test_image_pull_secrets_are_refused() -> None:
    assert refusals(imagePullSecrets=[{"name": "team-b-registry"}]) == [f"{SPEC}.imagePullSecrets"]


@pytest.mark.parametrize(
    ("change", "spec", "field"),
    [
        ({"securityContext": {"procMount": "Unmasked"}}, {}, f"{C0}.securityContext.procMount"),
        (
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {},
            f"{C0}.securityContext.seccompProfile.type",
        ),
        (
            {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
            {},
            f"{C0}.securityContext.appArmorProfile.type",
        ),
        (
            {"securityContext": {"windowsOptions": {"hostProcess": True}}},
            {},
            f"{C0}.securityContext.windowsOptions.hostProcess",
        ),
        (
            {},
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            f"{SPEC}.securityContext.seccompProfile.type",
        ),
        (
            {},
            {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
            f"{SPEC}.securityContext.seLinuxOptions.type",
        ),
        (
            {},
            {"securityContext": {"seLinuxOptions": {"user": "root"}}},
            f"{SPEC}.securityContext.seLinuxOptions.user",
        ),
        (
            {},
            {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
            f"{SPEC}.securityContext.sysctls[0].name",
        ),
    ],
)
def test_the_rest_of_the_baseline_is_kept(change: dict[str, Any], spec: dict[str, Any], field: str) -> None:
    assert refusals(change, **spec) == [field]


def test_an_unconfined_apparmor_annotation_is_refused() -> None:
    key = "container.apparmor.security.beta.kubernetes.io/main"
    template = {"metadata": {"annotations": {key: "unconfined"}}, "spec": {"containers": []}}
    assert [e.field for e in shared_namespace_errors(template, PREFIX, TENANT)] == [
        f"{PREFIX}.metadata.annotations[{key!r}]"
    ]


def test_a_job_names_the_group_of_each_refusal() -> None:
    ok = {"spec": {"containers": [{"name": "m", "image": "x:1"}]}}
    bad = {"spec": {"hostNetwork": True, "containers": [{"name": "m", "image": "x:1"}]}}
    spec = a_job("j").group("a", gpus=1).group("b", gpus=1).as_dict()
    spec["pod_groups"][0]["template"], spec["pod_groups"][1]["template"] = ok, bad
    errors = job_template_errors(JobSpec.model_validate(spec), required=False)
    assert [e.field for e in errors] == ["pod_groups[1].template.spec.hostNetwork"]


async def test_a_job_asking_for_the_host_is_rejected_at_submission(uow: Any) -> None:
    spec = a_job("evil").as_dict()
    spec["pod_groups"][0]["template"] = {
        "spec": {
            "serviceAccountName": "tessera-admission",
            "containers": [{"name": "m", "image": "busybox:1.37", "securityContext": {"privileged": True}}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        }
    }
    async with uow:
        result = await submit_job(spec, uow, "evil-1", templates_required=True)
        await uow.commit()
    assert [e.field for e in result.errors] == [
        f"{SPEC}.serviceAccountName",
        f"{SPEC}.volumes[0].hostPath",
        f"{C0}.securityContext.privileged",
    ]
    assert result.state == "rejected" and "evil-1" not in uow.fake_jobs.workloads
