"""Readers of the openb CSV format (Alibaba GPU cluster trace 2023) into placement value types."""

from __future__ import annotations

import csv
from pathlib import Path

from tessera.scheduler.domain.placement import NodeSpec, PlacementInputError, PodShape

DATA_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "openb"
DEFAULT_NODES = DATA_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = DATA_DIR / "openb_pod_list_default.csv"

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


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
        try:
            nodes.append(
                NodeSpec(
                    name=row["sn"],
                    cpu_milli=_int(path, line, row, "cpu_milli"),
                    memory_mib=_int(path, line, row, "memory_mib"),
                    gpu_count=_int(path, line, row, "gpu"),
                    model=(row["model"] or "").strip(),
                )
            )
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
        try:
            pod = PodShape(
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                num_gpu=_int(path, line, row, "num_gpu"),
                gpu_milli=_int(path, line, row, "gpu_milli") if _int(path, line, row, "num_gpu") else 0,
                gpu_models=models,
            )
        except PlacementInputError as e:
            raise PlacementInputError(f"{path}:{line}: {e}") from None
        named.append((row["name"], pod))
    if not named:
        raise PlacementInputError(f"{path}: no pods")
    named.sort(key=lambda np_: np_[0])
    return [p for _, p in named]
