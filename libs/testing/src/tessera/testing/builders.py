"""Builders that keep tests short: envelopes as a consumer receives them, and job specs."""

from __future__ import annotations

from typing import Any

from tessera.contracts.base import Message
from tessera.contracts.jobs import JobSpec
from tessera.core.messaging.envelope import Envelope, decode, encode


def an_envelope(message: Message, *, source: str = "tessera/test", **headers: str) -> Envelope:
    """`message` as it arrives at a handler: encoded as a CloudEvent, then decoded."""
    subject, encoded_headers, body = encode(message, source)
    return decode(subject, {**encoded_headers, **headers}, body)


TRAINING_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


class JobSpecBuilder:
    """`a_job("train").tenant("team-a").group("workers", replicas=4, gpus=8).build()`."""

    def __init__(self, name: str) -> None:
        self._spec: dict[str, Any] = {"name": name, "tenant": "tenant", "pod_groups": []}
        self._image: str | None = None

    def tenant(self, tenant: str) -> JobSpecBuilder:
        self._spec["tenant"] = tenant
        return self

    def queue(self, queue: str) -> JobSpecBuilder:
        self._spec["queue"] = queue
        return self

    def priority(self, priority: int) -> JobSpecBuilder:
        self._spec["priority"] = priority
        return self

    def group(
        self, name: str = "workers", *, replicas: int = 1, gpus: int | None = 1, milli: int | None = None
    ) -> JobSpecBuilder:
        gpu: dict[str, Any] | None = {"milli": milli} if milli is not None else None
        if gpu is None and gpus is not None:
            gpu = {"count": gpus}
        group: dict[str, Any] = {"name": name, "replicas": replicas}
        if gpu is not None:
            group["gpu"] = gpu
        self._spec["pod_groups"].append(group)
        return self

    def image(self, image: str = TRAINING_IMAGE) -> JobSpecBuilder:
        """Every pod group runs ``image`` (a template with one container): a job that runs on a cluster."""
        self._image = image
        return self

    def with_(self, **fields: Any) -> JobSpecBuilder:
        self._spec.update(fields)
        return self

    def as_dict(self) -> dict[str, Any]:
        spec = dict(self._spec)
        if not spec["pod_groups"]:
            spec["pod_groups"] = [{"name": "workers", "replicas": 1, "gpu": {"count": 1}}]
        if self._image is not None:
            container = {"name": "main", "image": self._image}
            spec["pod_groups"] = [
                {"template": {"spec": {"containers": [container]}}, **group} for group in spec["pod_groups"]
            ]
        return spec

    def build(self) -> JobSpec:
        return JobSpec.model_validate(self.as_dict())


def a_job(name: str = "job") -> JobSpecBuilder:
    return JobSpecBuilder(name)
