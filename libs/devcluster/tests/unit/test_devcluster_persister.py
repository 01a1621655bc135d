"""The snapshot writer: what it writes reads back, and a costly snapshot is written less often."""

from __future__ import annotations

import json
from pathlib import Path

from tessera.devcluster import persistence
from tessera.devcluster.apiserver.patching import MERGE_PATCH
from tessera.devcluster.apiserver.resources import PODS
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.sim.context import SimContext, SimSettings


def pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "é"}},
        "spec": {"containers": [{"name": "c", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}]},
    }


def test_a_saved_snapshot_reads_back_whole_and_records_its_cost(tmp_path: Path) -> None:
    store = ObjectStore()
    for i in range(200):
        store.create(PODS, "default", pod(f"p{i}"))
    path = tmp_path / "state.json"
    writer = persistence.Persister(path, store, SimContext(store, SimSettings(), {}), interval=1.0)
    writer.save()
    snapshot = persistence.read(path)
    assert snapshot["revision"] == store.revision
    names = sorted(entry["object"]["metadata"]["name"] for entry in snapshot["objects"])
    assert names == sorted(f"p{i}" for i in range(200))
    assert snapshot["objects"][0]["object"]["metadata"]["labels"] == {"app": "é"}
    assert writer.last_cost_s > 0


def test_the_writer_pauses_ten_times_as_long_as_a_snapshot_costs(tmp_path: Path) -> None:
    store = ObjectStore()
    writer = persistence.Persister(
        tmp_path / "s.json", store, SimContext(store, SimSettings(), {}), interval=1.0
    )
    assert writer.pause_s == 1.0  # cheap snapshots: every interval
    writer.last_cost_s = 0.05
    assert writer.pause_s == 1.0
    writer.last_cost_s = 0.4  # a snapshot of 0.4 s: at most a tenth of the time goes to writing
    assert writer.pause_s == 0.4 / persistence.COST_SHARE == 4.0


def test_the_encoder_writes_what_take_holds_after_objects_change_between_snapshots() -> None:
    store = ObjectStore()
    ctx = SimContext(store, SimSettings(), {})
    encoder = persistence.SnapshotEncoder()
    assert json.loads(encoder.encode(store, ctx)) == persistence.take(store, ctx)  # nothing stored yet
    for i in range(50):
        store.create(PODS, "default", pod(f"p{i}"))
    first = encoder.encode(store, ctx)
    assert first == json.dumps(persistence.take(store, ctx), separators=(",", ":")).encode()

    store.patch(PODS, "default", "p3", {"metadata": {"labels": {"app": "changed"}}}, MERGE_PATCH)
    store.delete(PODS, "default", "p7")
    store.create(PODS, "default", pod("late"))
    second = encoder.encode(store, ctx)

    assert second == json.dumps(persistence.take(store, ctx), separators=(",", ":")).encode()
    objects = {e["object"]["metadata"]["name"]: e["object"] for e in json.loads(second)["objects"]}
    assert objects["p3"]["metadata"]["labels"] == {"app": "changed"}
    assert "p7" not in objects and "late" in objects
