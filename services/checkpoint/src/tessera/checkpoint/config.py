"""Settings of the checkpoint service: env prefix `TESSERA_CHECKPOINT_`.

``kubeconfig`` (or the shared ``TESSERA_KUBECONFIG``) lets the service watch nodes for impending
termination (spot interruptions, scale-down, maintenance). Without one it still coordinates
preemptions, which reach it as events.

``GET /v1/jobs/{id}/checkpoints`` needs a bearer token that may see the job, checked with admission
(``admission_url``) as telemetry checks tokens for its usage API; ``auth=disabled`` only for a local stack.
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, BaseModel, Field, SecretStr

from tessera.checkpoint.domain.model import NODE_TERMINATION, SPOT_INTERRUPTION
from tessera.checkpoint.domain.signals import TerminationPolicy
from tessera.core.settings import ServiceSettings, http_port, service_config
from tessera.core.tenant_tokens import AuthMode, TenantTokens

#: taint key -> why a node carrying it is going away (the reason of the checkpoint requests it causes)
DEFAULT_TERMINATION_TAINTS: dict[str, str] = {
    # AWS Node Termination Handler (IMDS or queue mode, `taintNode: true`); the value is the event id.
    "aws-node-termination-handler/spot-itn": SPOT_INTERRUPTION,
    "aws-node-termination-handler/rebalance-recommendation": SPOT_INTERRUPTION,
    "aws-node-termination-handler/scheduled-maintenance": NODE_TERMINATION,
    "aws-node-termination-handler/asg-lifecycle-termination": NODE_TERMINATION,
    # Karpenter v1 (and `karpenter.sh/disruption=disrupting` before v1), before it drains a node.
    "karpenter.sh/disrupted": NODE_TERMINATION,
    "karpenter.sh/disruption": NODE_TERMINATION,
    # GKE, on a preemption notice for a Spot or preemptible VM.
    "cloud.google.com/impending-node-termination": SPOT_INTERRUPTION,
}

#: label key -> reason: slicing marks a node whose busy GPUs it drains for a new layout (with the deadline
#: annotation below), so checkpointable jobs there save before slicing moves them
DEFAULT_TERMINATION_LABELS: dict[str, str] = {"tessera.io/slicing-drain": NODE_TERMINATION}

#: annotations that say when the node goes (RFC 3339 or Unix seconds); the first one present wins
DEFAULT_DEADLINE_ANNOTATIONS: list[str] = [
    "tessera.io/termination-deadline",
    "karpenter.sh/nodeclaim-termination-timestamp",
]


class SpotSettings(BaseModel):
    """Which node changes announce its end, and how much notice a job gets to checkpoint."""

    taints: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_TERMINATION_TAINTS),
        description="taint key -> reason (spot_interruption or node_termination)",
    )
    labels: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_TERMINATION_LABELS),
        description="label key, or key=value -> reason (slicing's drain label by default)",
    )
    deadline_annotations: list[str] = Field(default_factory=lambda: list(DEFAULT_DEADLINE_ANNOTATIONS))
    notice_s: float = Field(
        30.0, gt=0, description="time to checkpoint when the signal carries no deadline (GCP gives 30 s)"
    )
    sync_timeout_s: float = Field(30.0, gt=0, description="how long to wait for the first node list")

    def policy(self) -> TerminationPolicy:
        return TerminationPolicy(
            self.taints, self.labels, self.deadline_annotations, timedelta(seconds=self.notice_s)
        )


class CheckpointSettings(ServiceSettings):
    model_config = service_config("checkpoint")

    http_port: int = http_port(8085)
    kubeconfig: Path | None = Field(
        None,
        validation_alias=AliasChoices("TESSERA_CHECKPOINT_KUBECONFIG", "TESSERA_KUBECONFIG", "kubeconfig"),
        description="a kubeconfig of the cluster whose nodes to watch; none: no spot or node signals",
    )
    spot: SpotSettings = SpotSettings()
    deadline_poll_s: float = Field(
        5.0, gt=0, description="the deadline loop looks for overdue requests at least this often"
    )
    history_retention_h: float = Field(
        168.0, gt=0, description="ended requests and finished jobs are kept this long"
    )
    checkpoints_retention_h: float = Field(
        720.0, gt=0, description="records of checkpoints saved longer ago than this are deleted"
    )
    admission_url: str | None = Field(
        None,
        description="admission's API, to check a tenant's bearer token for GET /v1/jobs/{id}/checkpoints; "
        "without it only the admin token (or auth disabled) may read checkpoints",
    )
    auth: AuthMode = Field(
        "required", description="`disabled` only for a local stack: every caller may read every job's"
    )
    admin_token: SecretStr | None = Field(None, description="the admin bearer token (admission's)")

    def tokens(self) -> TenantTokens:
        secret = self.admin_token.get_secret_value() if self.admin_token else None
        return TenantTokens(self.admission_url, self.auth, secret, service="checkpoints")


@lru_cache
def get_settings() -> CheckpointSettings:
    return CheckpointSettings()
