"""The names Tessera and the NVIDIA GPU Operator agree on: scheduler, gangs, resources, labels, annotations."""

from __future__ import annotations

from typing import Final

SCHEDULER_NAME: Final = "tessera"

# Gangs are the scheduler-plugins PodGroup.
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
POD_GROUP_API_GROUP: Final = "scheduling.x-k8s.io"
POD_GROUP_VERSION: Final = "v1alpha1"
POD_GROUP_PLURAL: Final = "podgroups"
POD_GROUP_KIND: Final = "PodGroup"
POD_GROUP_API_VERSION: Final = f"{POD_GROUP_API_GROUP}/{POD_GROUP_VERSION}"

# Resources advertised by the NVIDIA device plugin.
GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"

# Tessera's own pod annotations.
GPU_MILLI_ANNOTATION: Final = "tessera.io/gpu-milli"
GPU_MODELS_ANNOTATION: Final = "tessera.io/gpu-models"
GPU_ASSIGNMENT_ANNOTATION: Final = "tessera.io/gpu-assignment"

# The jobs admission admits: their workloads label each pod with the job's id and pod group; a
# checkpointable job's pods are annotated as such and get the checkpoint to resume from in their env
# (what the checkpoint client and the devcluster's simulated trainer read).
JOB_ID_LABEL: Final = "tessera.io/job-id"
JOB_POD_GROUP_LABEL: Final = "tessera.io/pod-group-name"  # the job spec's pod group a pod belongs to
CHECKPOINTABLE_ANNOTATION: Final = "tessera.io/checkpointable"
CHECKPOINT_URI_ENV: Final = "TESSERA_CHECKPOINT_URI"

# The devcluster's simulation knobs on a pod (ignored by a real cluster): how long it runs, and what
# its simulated trainer does (state size, steps per simulated second, periodic checkpoint interval).
SIM_DURATION_ANNOTATION: Final = "tessera.io/sim-duration"
SIM_STATE_BYTES_ANNOTATION: Final = "tessera.io/sim-state-bytes"
SIM_STEPS_PER_SECOND_ANNOTATION: Final = "tessera.io/sim-steps-per-second"
SIM_CHECKPOINT_INTERVAL_ANNOTATION: Final = "tessera.io/sim-checkpoint-interval"

# Tessera's node annotations: the GPU inventory (from NVML via telemetry, or the devcluster) and the
# interconnect matrix, for what the GPU Operator's labels do not say (UUIDs, health, topology).
NODE_GPUS_ANNOTATION: Final = "tessera.io/gpus"
NODE_TOPOLOGY_ANNOTATION: Final = "tessera.io/gpu-topology"

# GPU Feature Discovery labels.
GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
GPU_REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
GPU_SHARING_STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"
MIG_CAPABLE_LABEL: Final = "nvidia.com/mig.capable"
MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"

# Slicing, driven through the GPU Operator.
MIG_CONFIG_LABEL: Final = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL: Final = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG_LABEL: Final = "nvidia.com/device-plugin.config"
#: the device-plugin configs slicing writes are named so; the scheduler places shares on a node whose
#: time-slicing replicas slicing chose by those replicas, not by milli (ADR 0021)
SLICING_DEVICE_PLUGIN_CONFIG_PREFIX: Final = "tessera-dp-"


def mig_resource_name(profile: str) -> str:
    """``nvidia.com/mig-<profile>`` as the device plugin's mixed strategy names it ('+me' becomes '.me')."""
    if not profile:
        raise ValueError("mig profile: must not be empty")
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def mig_profile_of_resource(resource: str) -> str | None:
    """The MIG profile a resource name stands for, or None for any other resource."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    suffix = resource[len(MIG_RESOURCE_PREFIX) :]
    if suffix.endswith(".me"):
        suffix = suffix[: -len(".me")] + "+me"
    return suffix or None


def mig_count_label(profile: str) -> str:
    """GFD's per-profile count label, e.g. ``nvidia.com/mig-1g.10gb.count``."""
    return f"{mig_resource_name(profile)}.count"
