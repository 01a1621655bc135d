"""The ``tessera.io/gpu-assignment`` annotation: which GPUs (by UUID) and how much of each a pod holds.

Format (JSON, version 1)::

    {"v": 1, "node": "gpu-node-3", "pod_uid": "3f2c…",
     "gpus": [{"uuid": "GPU-…", "milli": 1000},
              {"uuid": "GPU-…", "milli": 1000, "mig": {"profile": "1g.10gb", "start": 6, "uuid": "MIG-…"}}]}

``pod_uid`` (optional) is the uid of the pod the scheduler's bind wrote it for: a copy of the
annotation onto another pod names a uid that is not that pod's. Binds before it was written left it
out; such an annotation is of the earlier format, not a copy.
"""

from __future__ import annotations

import json
from typing import Any

from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare, MigSlice

ASSIGNMENT_FORMAT_VERSION = 1


def encode_assignment(assignment: DeviceAssignment) -> str:
    gpus: list[dict[str, Any]] = []
    for share in assignment.shares:
        item: dict[str, Any] = {"uuid": share.gpu_uuid, "milli": share.milli}
        if share.mig is not None:
            mig: dict[str, Any] = {"profile": share.mig.profile, "start": share.mig.start}
            if share.mig.uuid:
                mig["uuid"] = share.mig.uuid
            item["mig"] = mig
        gpus.append(item)
    raw: dict[str, Any] = {"v": ASSIGNMENT_FORMAT_VERSION, "node": assignment.node}
    if assignment.pod_uid is not None:
        raw["pod_uid"] = assignment.pod_uid
    raw["gpus"] = gpus
    return json.dumps(raw, separators=(",", ":"))


def decode_assignment(text: str) -> DeviceAssignment:
    """Parse the annotation; a malformed one raises ValueError naming the field."""
    field = "tessera.io/gpu-assignment"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field}: not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{field}: expected a JSON object")
    if raw.get("v", ASSIGNMENT_FORMAT_VERSION) != ASSIGNMENT_FORMAT_VERSION:
        raise ValueError(f"{field}.v: unsupported version {raw.get('v')!r}")
    node = raw.get("node")
    if not isinstance(node, str) or not node:
        raise ValueError(f"{field}.node: expected a non-empty string")
    pod_uid = raw.get("pod_uid")
    if pod_uid is not None and not isinstance(pod_uid, str):
        raise ValueError(f"{field}.pod_uid: expected a string")
    gpus = raw.get("gpus")
    if not isinstance(gpus, list):
        raise ValueError(f"{field}.gpus: expected a list")
    shares = []
    for i, item in enumerate(gpus):
        where = f"{field}.gpus[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("uuid"), str):
            raise ValueError(f"{where}.uuid: expected a string")
        milli = item.get("milli", 1000)
        if not isinstance(milli, int) or isinstance(milli, bool):
            raise ValueError(f"{where}.milli: expected an integer")
        mig = None
        if item.get("mig") is not None:
            spec = item["mig"]
            if not isinstance(spec, dict) or not isinstance(spec.get("profile"), str):
                raise ValueError(f"{where}.mig.profile: expected a string")
            if not isinstance(spec.get("start"), int):
                raise ValueError(f"{where}.mig.start: expected an integer")
            mig = MigSlice(spec["profile"], spec["start"], spec.get("uuid"))
        try:
            shares.append(GpuShare(item["uuid"], milli, mig))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    try:
        return DeviceAssignment(node, tuple(shares), pod_uid)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
