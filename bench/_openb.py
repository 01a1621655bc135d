"""Readers of the openb CSV format (Alibaba GPU cluster trace 2023) into placement value types."""

from __future__ import annotations

import csv
from pathlib import Path

from tessera.devcluster import data
from tessera.scheduler.domain.placement import NodeSpec, PlacementInputError, PodShape

# The openb trace shipped in the repository (libs/devcluster/src/tessera/devcluster/data/openb/),
# or under $TESSERA_DATA_DIR when it is set.
DEFAULT_NODES = data.trace(data.OPENB_NODES)
DEFAULT_PODS = data.trace(data.OPENB_PODS)

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
# `gpu_spec` is optional: some pod lists published with the FGD paper lack it (no model constraint)
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def _rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise PlacementInputError(f"{path}: file not found")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise PlacementInputError(f"{path}: missing column(s) {', '.join(missing)}")
        return list(reader)


def _int(path: Path, line: int, row: dict[str, str], field: str) -> int:
    raw = (row.get(field) or "").strip()
    try:
        return int(float(raw)) if raw else 0
    except ValueError:
        raise PlacementInputError(f"{path}:{line}: {field} must be an integer, got {raw!r}") from None


def load_nodes(path: Path) -> list[NodeSpec]:
    """Nodes of an openb node list, in file order."""
    nodes = []
    for line, row in enumerate(_rows(path, NODE_COLUMNS), start=2):
        cpu, memory, gpus = (_int(path, line, row, f) for f in ("cpu_milli", "memory_mib", "gpu"))
        try:
            nodes.append(NodeSpec(row["sn"], cpu, memory, gpus, (row["model"] or "").strip()))
        except PlacementInputError as e:
            raise PlacementInputError(f"{path}:{line}: {e}") from None
    if not nodes:
        raise PlacementInputError(f"{path}: no nodes")
    return nodes


def load_pods(path: Path) -> list[PodShape]:
    """Pod requests of an openb pod list, sorted by pod name (times, qos and phase are ignored)."""
    named: list[tuple[str, PodShape]] = []
    for line, row in enumerate(_rows(path, POD_COLUMNS), start=2):
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(m.strip() for m in spec.split("|") if m.strip())
        cpu, memory, count, milli = (
            _int(path, line, row, f) for f in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
        )
        try:
            # gpu_milli of a GPU-less pod is meaningless in the trace; it is ignored
            pod = PodShape(cpu, memory, count, milli if count else 0, models)
        except PlacementInputError as e:
            raise PlacementInputError(f"{path}:{line}: {e}") from None
        named.append((row["name"], pod))
    if not named:
        raise PlacementInputError(f"{path}: no pods")
    named.sort(key=lambda np_: np_[0])
    return [p for _, p in named]


# Synthetic workload mixes derived from a pod list, to check that a policy is not tuned to one trace.
VARIANTS: dict[str, str] = {
    "sharing-x2": "pods resampled with GPU-sharing pods twice as likely",
    "multi-gpu-x5": "pods resampled with multi-GPU pods five times as likely",
    "cpu-only-x2": "pods resampled with CPU-only pods twice as likely",
    "gpu-spec-30": "30% of GPU pods restricted to two GPU models (drawn by GPU count)",
}


def _pod_class(pod: PodShape) -> str:
    if pod.num_gpu == 0:
        return "cpu-only"
    if pod.is_sharing:
        return "sharing"
    return "multi-gpu" if pod.num_gpu > 1 else "one-gpu"


def derive_variant(
    pods: list[PodShape], nodes: list[NodeSpec], variant: str, seed: int = 0
) -> list[PodShape]:
    """A pod list of the same size as `pods`, reshaped as described in VARIANTS[variant]."""
    import numpy as np  # local: only the variant study needs it

    rng = np.random.default_rng(seed)
    boost = {
        "sharing-x2": ("sharing", 2.0),
        "multi-gpu-x5": ("multi-gpu", 5.0),
        "cpu-only-x2": ("cpu-only", 2.0),
    }
    if variant in boost:
        cls, factor = boost[variant]
        weight = np.array([factor if _pod_class(p) == cls else 1.0 for p in pods])
        picks = rng.choice(len(pods), size=len(pods), replace=True, p=weight / weight.sum())
        return [pods[int(i)] for i in picks]
    if variant == "gpu-spec-30":
        gpus_by_model: dict[str, int] = {}
        for n in nodes:
            gpus_by_model[n.model] = gpus_by_model.get(n.model, 0) + n.gpu_count
        models = sorted(m for m, g in gpus_by_model.items() if g > 0)
        share = np.array([gpus_by_model[m] for m in models], dtype=np.float64)
        out = []
        for p in pods:
            if p.num_gpu > 0 and len(models) > 1 and rng.random() < 0.3:
                chosen = rng.choice(len(models), size=2, replace=False, p=share / share.sum())
                p = PodShape(
                    p.cpu_milli,
                    p.memory_mib,
                    p.num_gpu,
                    p.gpu_milli,
                    frozenset(models[int(i)] for i in chosen),
                )
            out.append(p)
        return out
    raise PlacementInputError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
