"""What a job's pod template may ask for, given that admission creates its pods in a namespace that
tenants share, with admission's own Kubernetes rights.

A tenant's token needs no Kubernetes rights of its own, so whatever a template asks for, admission
grants. The template is refused, at submission, where it would reach beyond the tenant's own job:

- the Pod Security Standards' "baseline" profile
  (https://kubernetes.io/docs/concepts/security/pod-security-standards/#baseline): no privileged or
  Windows HostProcess containers, no host network, PID or IPC namespace, no hostPath volume, no host
  port, no capability added beyond the baseline's list, no Unconfined seccomp or AppArmor profile, no
  custom SELinux user, role or type, no unmasked /proc, and only the safe sysctls;
- no service account but the namespace's `default` (another would act with that account's rights);
- no reference to a Secret (`envFrom[].secretRef`, `env[].valueFrom.secretKeyRef`, `secret` and
  projected-secret volumes, a volume's secret reference, `imagePullSecrets`): every tenant's Secrets
  live in the same namespace;
- no PersistentVolumeClaim, ConfigMap, ResourceClaim, or VolumeSnapshot or claim to fill a volume
  from, of another tenant (`tenant_objects`): a name must begin with the job's tenant and `-`; no
  volume filled from an object of another kind (a populator's) or another namespace; and no claim
  that chooses the PersistentVolume it binds (`volumeName`, `selector`).

Each error names its path from the job spec's root and the reason, e.g.
`pod_groups[0].template.spec.containers[0].securityContext.privileged: ...`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from tessera.admission.domain.tenant_objects import foreign_object_errors
from tessera.contracts.base import FieldError

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
"""Capabilities the baseline profile lets a container add."""

SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
"""The sysctls the baseline profile allows."""

SELINUX_TYPES = frozenset({"container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
DEFAULT_SERVICE_ACCOUNT = "default"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
VOLUME_SECRET_KEYS = ("secretRef", "secretName", "nodePublishSecretRef")
"""Keys by which a volume source (csi, cephfs, rbd, iscsi, azureFile, flexVolume, ...) names a Secret."""

SHARED = "admission runs the pods in a namespace that tenants share"
BASELINE = "not allowed by the Pod Security Standards' baseline profile; " + SHARED


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in CONTAINER_LISTS:
        for index, container in enumerate(_list(spec.get(kind))):
            if isinstance(container, Mapping):
                yield f"{prefix}.{kind}[{index}]", container


def _security_context_errors(context: Mapping[str, Any], at: str) -> list[FieldError]:
    """Baseline rules that hold alike for the pod's and a container's securityContext."""
    errors = []
    if _map(context.get("windowsOptions")).get("hostProcess") is True:
        errors.append(
            FieldError(field=f"{at}.windowsOptions.hostProcess", reason=f"must not be true: {BASELINE}")
        )
    if _map(context.get("seccompProfile")).get("type") == "Unconfined":
        errors.append(
            FieldError(field=f"{at}.seccompProfile.type", reason=f"must not be Unconfined: {BASELINE}")
        )
    if _map(context.get("appArmorProfile")).get("type") == "Unconfined":
        errors.append(
            FieldError(field=f"{at}.appArmorProfile.type", reason=f"must not be Unconfined: {BASELINE}")
        )
    selinux = _map(context.get("seLinuxOptions"))
    if "type" in selinux and selinux["type"] not in SELINUX_TYPES:
        allowed = ", ".join(sorted(SELINUX_TYPES))
        errors.append(
            FieldError(field=f"{at}.seLinuxOptions.type", reason=f"must be one of {allowed}: {BASELINE}")
        )
    for key in ("user", "role"):
        if selinux.get(key):
            errors.append(
                FieldError(field=f"{at}.seLinuxOptions.{key}", reason=f"must not be set: {BASELINE}")
            )
    return errors


def _container_errors(container: Mapping[str, Any], at: str) -> list[FieldError]:
    errors = []
    context = _map(container.get("securityContext"))
    sc = f"{at}.securityContext"
    if context.get("privileged") is True:
        errors.append(FieldError(field=f"{sc}.privileged", reason=f"must not be true: {BASELINE}"))
    for index, capability in enumerate(_list(_map(context.get("capabilities")).get("add"))):
        if capability not in BASELINE_CAPABILITIES:
            errors.append(
                FieldError(
                    field=f"{sc}.capabilities.add[{index}]",
                    reason=f"{capability} is not among the baseline's capabilities "
                    f"({', '.join(sorted(BASELINE_CAPABILITIES))}): {BASELINE}",
                )
            )
    if context.get("procMount") not in (None, "Default"):
        errors.append(FieldError(field=f"{sc}.procMount", reason=f"must be Default: {BASELINE}"))
    errors += _security_context_errors(context, sc)
    for index, port in enumerate(_list(container.get("ports"))):
        if _map(port).get("hostPort") not in (None, 0):
            errors.append(
                FieldError(field=f"{at}.ports[{index}].hostPort", reason=f"must not be set: {BASELINE}")
            )
    for index, source in enumerate(_list(container.get("envFrom"))):
        if "secretRef" in _map(source):
            errors.append(
                FieldError(
                    field=f"{at}.envFrom[{index}].secretRef", reason=f"must not name a Secret: {SHARED}"
                )
            )
    for index, variable in enumerate(_list(container.get("env"))):
        if "secretKeyRef" in _map(_map(variable).get("valueFrom")):
            errors.append(
                FieldError(
                    field=f"{at}.env[{index}].valueFrom.secretKeyRef",
                    reason=f"must not name a Secret: {SHARED}",
                )
            )
    return errors


def _volume_errors(volume: Mapping[str, Any], at: str) -> list[FieldError]:
    errors = []
    if "hostPath" in volume:
        errors.append(FieldError(field=f"{at}.hostPath", reason=f"hostPath volumes are {BASELINE}"))
    if "secret" in volume:
        errors.append(FieldError(field=f"{at}.secret", reason=f"must not mount a Secret: {SHARED}"))
    for index, source in enumerate(_list(_map(volume.get("projected")).get("sources"))):
        if "secret" in _map(source):
            errors.append(
                FieldError(
                    field=f"{at}.projected.sources[{index}].secret",
                    reason=f"must not mount a Secret: {SHARED}",
                )
            )
    for kind, source in volume.items():
        if kind in ("name", "hostPath", "secret", "projected") or not isinstance(source, Mapping):
            continue
        for key in VOLUME_SECRET_KEYS:
            if key in source:
                errors.append(
                    FieldError(field=f"{at}.{kind}.{key}", reason=f"must not name a Secret: {SHARED}")
                )
    return errors


def shared_namespace_errors(
    template: object, prefix: str, tenant: str, tenants: Collection[str] = ()
) -> list[FieldError]:
    """What one pod template of ``tenant``'s job asks for beyond its own job in a namespace that
    tenants share; an empty list when admission may run it there. `prefix` is the template's path in
    the job spec; ``tenants``, the other tenants known (`tenant_objects`)."""
    if not isinstance(template, Mapping):
        return []
    errors: list[FieldError] = []
    for key, value in _map(_map(template.get("metadata")).get("annotations")).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and value == "unconfined":
            errors.append(
                FieldError(
                    field=f"{prefix}.metadata.annotations[{str(key)!r}]",
                    reason=f"must not be unconfined: {BASELINE}",
                )
            )
    spec = _map(template.get("spec"))
    at = f"{prefix}.spec"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key) is True:
            errors.append(FieldError(field=f"{at}.{key}", reason=f"must not be true: {BASELINE}"))
    context = _map(spec.get("securityContext"))
    errors += _security_context_errors(context, f"{at}.securityContext")
    for index, sysctl in enumerate(_list(context.get("sysctls"))):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            errors.append(
                FieldError(
                    field=f"{at}.securityContext.sysctls[{index}].name",
                    reason=f"{name} is not among the baseline's safe sysctls: {BASELINE}",
                )
            )
    for key in ("serviceAccountName", "serviceAccount"):
        if spec.get(key) not in (None, "", DEFAULT_SERVICE_ACCOUNT):
            errors.append(
                FieldError(
                    field=f"{at}.{key}",
                    reason=f"must be {DEFAULT_SERVICE_ACCOUNT!r} or unset: the pods would act with that "
                    f"service account's rights, and {SHARED}",
                )
            )
    if _list(spec.get("imagePullSecrets")):
        errors.append(FieldError(field=f"{at}.imagePullSecrets", reason=f"must not name a Secret: {SHARED}"))
    for index, volume in enumerate(_list(spec.get("volumes"))):
        if isinstance(volume, Mapping):
            errors += _volume_errors(volume, f"{at}.volumes[{index}]")
    for where, container in _containers(spec, at):
        errors += _container_errors(container, where)
    return errors + foreign_object_errors(spec, at, tenant, tenants)
