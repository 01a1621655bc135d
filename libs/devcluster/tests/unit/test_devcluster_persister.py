"""The snapshot writer: what it writes reads back, and a costly snapshot is written less often."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.domain.gpu import MigInstance
from tessera.devcluster import persistence
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.patching import MERGE_PATCH
from tessera.devcluster.apiserver.resources import PODS, ResourceRegistry
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.sim.context import PodDevices, SimContext, SimSettings
from tessera.devcluster.sim.devices import Holding
from tessera.devcluster.sim.state import SimNode


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


def restart(snapshot_path: Path) -> ObjectStore:
    """A new store as a devcluster restarted on ``snapshot_path`` has it, before it serves."""
    store = ObjectStore()
    persistence.resume_revisions(snapshot_path, store)
    if snapshot_path.exists():
        ctx = SimContext(store, SimSettings(), {})
        persistence.restore(
            persistence.read(snapshot_path), store, ResourceRegistry(), ctx, lambda crd: None, snapshot_path
        )
    return store


async def test_revisions_are_recorded_before_use_and_a_restart_after_a_crash_goes_on_past_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    store = ObjectStore()
    writer = persistence.Persister(path, store, SimContext(store, SimSettings(), {}), interval=1.0)
    store.create(PODS, "default", pod("kept"))
    writer.save()
    lost = store.create(PODS, "default", pod("lost"))  # after the last snapshot: a SIGKILL loses it

    reserved = persistence.read_reserved(path)
    assert reserved is not None and reserved >= int(lost["metadata"]["resourceVersion"])
    restarted = restart(path)
    written = restarted.create(PODS, "default", pod("new"))

    assert [p["metadata"]["name"] for p in restarted.list(PODS)[0]] == ["kept", "new"]
    assert int(written["metadata"]["resourceVersion"]) > reserved
    with pytest.raises(ApiError) as caught:
        restarted.watch(PODS, resource_version=lost["metadata"]["resourceVersion"])
    assert caught.value.code == 410


def test_a_run_killed_before_its_first_snapshot_leaves_its_revisions_reserved(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = ObjectStore()
    persistence.Persister(path, store, SimContext(store, SimSettings(), {}), interval=1.0)
    seen = store.create(PODS, "default", pod("lost"))

    restarted = restart(path)  # no snapshot was written
    written = restarted.create(PODS, "default", pod("new"))

    assert not path.exists()
    assert int(written["metadata"]["resourceVersion"]) > int(seen["metadata"]["resourceVersion"])


def test_a_record_of_reserved_revisions_that_cannot_be_read_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    persistence.reserved_path(path).write_text('{"reserved": "many"}')

    with pytest.raises(persistence.SnapshotError, match=r"state.json.reserved: reserved: expected"):
        persistence.read_reserved(path)


def test_nodes_and_devices_changed_in_place_are_encoded_again_and_the_rest_reused() -> None:
    store = ObjectStore()
    specs = [NodeSpec(f"n{i}", 64_000, 262_144, "A100-80GB", 2, 81920, {}) for i in range(3)]
    ctx = SimContext(store, SimSettings(), {s.name: SimNode.from_spec(s, i) for i, s in enumerate(specs)})
    gpu = ctx.nodes["n0"].gpus[0].uuid
    ctx.devices["default/a"] = PodDevices("n0", "u-a", [Holding(gpu, 500)], "", cpu_milli=100)
    ctx.devices["default/b"] = PodDevices("n1", "u-b", [Holding(gpu, 1000)], "")
    encoder = persistence.SnapshotEncoder()

    def expected() -> bytes:
        return json.dumps(persistence.take(store, ctx), separators=(",", ":")).encode()

    assert encoder.encode(store, ctx) == expected()
    unchanged = encoder.encode(store, ctx)

    changes = [
        lambda: ctx.nodes["n0"].gpus[1].xids.append(79),
        lambda: setattr(ctx.nodes["n1"].gpus[0], "mig_instances", (MigInstance("1g.10gb", 0, "MIG-x"),)),
        lambda: setattr(ctx.nodes["n1"].gpus[0], "mig_enabled", True),
        lambda: setattr(ctx.nodes["n2"].gpus[0], "overheating", True),
        lambda: setattr(ctx.nodes["n2"].gpus[1], "lost", True),
        lambda: setattr(ctx.nodes["n2"], "replicas", 4),
        lambda: setattr(ctx.nodes["n0"], "applied_mig_config", "all-1g.10gb"),
        lambda: setattr(ctx.nodes["n0"], "attempted_mig_config", "all-2g.20gb"),
        lambda: setattr(ctx.nodes["n1"], "lost", True),
        lambda: setattr(ctx.devices["default/a"], "running", True),
        lambda: setattr(ctx.devices["default/b"], "holdings", [Holding(gpu, 0, "1g.10gb", 0)]),
        lambda: setattr(ctx.devices["default/b"], "memory_mib", 512),
        lambda: ctx.devices.pop("default/a"),
        lambda: ctx.nodes.pop("n2"),
    ]
    for i, change in enumerate(changes):
        before = expected()
        change()
        assert expected() != before, f"change {i} shows in the snapshot"
        assert encoder.encode(store, ctx) == expected(), f"change {i}"
    assert unchanged != encoder.encode(store, ctx)


def test_the_devices_key_covers_every_field_a_snapshot_writes() -> None:
    held = PodDevices("n0", "u", [Holding("GPU-1", 500)], "p", True, 1, 2)
    assert len(persistence._devices_key(held)) == len(dataclasses.fields(PodDevices))
