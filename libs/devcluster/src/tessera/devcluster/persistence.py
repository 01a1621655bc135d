"""The devcluster's state on disk: every API object and the simulated hardware, so a restart resumes.

A snapshot is one JSON file holding the store's objects (with their type and the revision) and the
simulation's own state: each node's MIG layout, faults and time-slicing replicas, and the devices
each admitted pod holds. It is written atomically (a temporary file, fsynced, then renamed) every
`interval` seconds while something changed (less often while a snapshot is costly to write: at most
a tenth of the time goes to writing), and once more on a clean stop. On start the devcluster
restores it when the file exists: CRDs are served again before their objects return, and the
kubelet takes back the pods it had admitted (see `Kubelet.resume`). What is not kept: watch history
(watchers relist after a 410), pending spot-interruption notices, and trainers' in-memory progress
(a resumed trainer starts from its newest checkpoint, as after a pod restart).

A SIGKILL loses the writes after the last snapshot, but watchers and writers may have seen their
resourceVersions. So the store reserves its revisions a block at a time, and the newest reserved
is written (atomically, before any of the block is used) to a small file beside the snapshot
(``state.json.reserved``); a restart goes on past it, and a watch from an earlier resourceVersion
gets 410 Gone and relists (see `ObjectStore.resume_after`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tessera.cluster.domain.gpu import MigInstance
from tessera.devcluster.apiserver.resources import ResourceRegistry, ResourceType
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.sim.context import PodDevices, SimContext
from tessera.devcluster.sim.devices import Holding
from tessera.devcluster.sim.state import SimNode

log = logging.getLogger(__name__)

FORMAT = 1
_CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")


class SnapshotError(ValueError):
    """A snapshot file that cannot be restored; the message names the file and the field."""


def take(store: ObjectStore, ctx: SimContext) -> dict[str, Any]:
    """Everything a restart needs, as JSON-ready data."""
    revision, objects = store.contents()
    with ctx.lock:
        nodes = {name: _node_state(node) for name, node in ctx.nodes.items()}
        devices = {key: asdict(held) for key, held in ctx.devices.items()}
    return {
        "format": FORMAT,
        "revision": revision,
        "objects": [
            {"group": r.group, "version": r.version, "plural": r.plural, "object": obj} for r, obj in objects
        ],
        "nodes": nodes,
        "devices": devices,
    }


def _dumps(value: Any) -> bytes:
    # json.dumps, not json.dump: only dumps uses the C encoder (dump encodes chunk by chunk in
    # Python, ~3x the CPU), and a snapshot of thousands of pods is written every second under load.
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


class SnapshotEncoder:
    """Encodes snapshots, each stored object once: the store replaces an object on every write and
    never changes one, so an object still held since the last snapshot has the same JSON, and only
    the objects written since are encoded again. Nodes and pods' devices are changed in place, so
    each is encoded again only when its key (every field it writes) differs from the last one's.
    The file is the same as ``_dumps(take(...))``."""

    def __init__(self) -> None:
        self._encoded: dict[int, tuple[dict[str, Any], bytes]] = {}
        self._nodes: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        self._devices: dict[str, tuple[tuple[Any, ...], bytes]] = {}

    def encode(self, store: ObjectStore, ctx: SimContext) -> bytes:
        revision, objects = store.contents()
        with ctx.lock:
            self._nodes, nodes = _members(self._nodes, ctx.nodes, _node_key, _node_state)
            self._devices, devices = _members(self._devices, ctx.devices, _devices_key, asdict)
        encoded: dict[int, tuple[dict[str, Any], bytes]] = {}
        parts = []
        for resource, obj in objects:
            held = self._encoded.get(id(obj))
            if held is None or held[0] is not obj:  # the object itself is kept, so its id is not reused
                entry = {"group": resource.group, "version": resource.version, "plural": resource.plural}
                held = (obj, _dumps({**entry, "object": obj}))
            encoded[id(obj)] = held
            parts.append(held[1])
        self._encoded = encoded
        return b"".join(
            (
                b'{"format":%d,"revision":%d,"objects":[' % (FORMAT, revision),
                b",".join(parts),
                b'],"nodes":{',
                b",".join(nodes),
                b'},"devices":{',
                b",".join(devices),
                b"}}",
            )
        )


def _members(
    cached: dict[str, tuple[tuple[Any, ...], bytes]],
    members: Mapping[str, Any],
    key: Callable[[Any], tuple[Any, ...]],
    state: Callable[[Any], dict[str, Any]],
) -> tuple[dict[str, tuple[tuple[Any, ...], bytes]], list[bytes]]:
    """Each member as ``"name":{...}``, encoded again only if its key changed since ``cached``; the
    new cache (members gone since are dropped) and the parts in the mapping's order."""
    fresh: dict[str, tuple[tuple[Any, ...], bytes]] = {}
    parts = []
    for name, member in members.items():
        wanted = key(member)
        held = cached.get(name)
        if held is None or held[0] != wanted:
            held = (wanted, _dumps(name) + b":" + _dumps(state(member)))
        fresh[name] = held
        parts.append(held[1])
    return fresh, parts


def _node_key(node: SimNode) -> tuple[Any, ...]:
    gpus = tuple((g.mig_enabled, g.mig_instances, tuple(g.xids), g.overheating, g.lost) for g in node.gpus)
    return (node.applied_mig_config, node.attempted_mig_config, node.lost, node.replicas, gpus)


def _devices_key(held: PodDevices) -> tuple[Any, ...]:
    return (
        held.node,
        held.uid,
        tuple(held.holdings),
        held.profile,
        held.running,
        held.cpu_milli,
        held.memory_mib,
    )


def write(path: Path, snapshot: dict[str, Any] | bytes) -> None:
    """Replace ``path`` with ``snapshot`` (or its encoding) atomically: a reader sees the old file or
    the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    data = snapshot if isinstance(snapshot, bytes) else _dumps(snapshot)
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SnapshotError(
            f"{path}: format: expected {FORMAT}, got {raw.get('format') if isinstance(raw, dict) else raw!r}"
        )
    return raw


def reserved_path(path: Path) -> Path:
    """Where the newest revision the store reserved is kept, beside the snapshot at ``path``."""
    return path.with_name(f"{path.name}.reserved")


def read_reserved(path: Path) -> int | None:
    """The newest revision reserved by the devcluster whose snapshot is ``path``; None if none was."""
    source = reserved_path(path)
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{source}: not JSON ({exc})") from exc
    reserved = raw.get("reserved") if isinstance(raw, dict) else None
    if not isinstance(reserved, int) or isinstance(reserved, bool) or reserved < 0:
        raise SnapshotError(f"{source}: reserved: expected a non-negative integer, got {reserved!r}")
    return reserved


def resume_revisions(path: Path, store: ObjectStore) -> None:
    """Make ``store`` go on past every revision a run before may have handed out (even one that died
    before its first snapshot): call it on a new store before anything is written, and after a
    restore (which `restore` does)."""
    reserved = read_reserved(path)
    if reserved is not None:
        store.resume_after(reserved)


def restore(
    snapshot: dict[str, Any],
    store: ObjectStore,
    registry: ResourceRegistry,
    ctx: SimContext,
    serve_crd: Any,
    source: Path,
) -> int:
    """Put a snapshot back before the devcluster serves; returns how many objects came back.
    ``serve_crd`` registers a CustomResourceDefinition's types, as a create through the API does."""
    entries = snapshot.get("objects")
    if not isinstance(entries, list):
        raise SnapshotError(f"{source}: objects: expected a list")
    for entry in entries:  # the types of custom resources first
        if (entry.get("group"), entry.get("plural")) == _CRDS:
            serve_crd(entry["object"])
    objects: list[tuple[ResourceType, dict[str, Any]]] = []
    for i, entry in enumerate(entries):
        resource = registry.find(str(entry.get("group")), str(entry.get("version")), str(entry.get("plural")))
        if resource is None:
            raise SnapshotError(
                f"{source}: objects[{i}]: {entry.get('group')}/{entry.get('version')} "
                f"{entry.get('plural')} is not served"
            )
        objects.append((resource, entry["object"]))
    revision = snapshot.get("revision")
    if not isinstance(revision, int) or revision < 0:
        raise SnapshotError(f"{source}: revision: expected a non-negative integer, got {revision!r}")
    store.restore(revision, objects)
    resume_revisions(source, store)
    with ctx.lock:
        for name, state in (snapshot.get("nodes") or {}).items():
            node = ctx.nodes.get(name)
            if node is None:
                log.warning(
                    "%s: node %s is not in the cluster file any more; its state is dropped", source, name
                )
                continue
            _restore_node(node, state)
        ctx.devices.clear()
        for key, held in (snapshot.get("devices") or {}).items():
            if held.get("node") in ctx.nodes:
                ctx.devices[key] = PodDevices(
                    node=held["node"],
                    uid=held["uid"],
                    holdings=[Holding(**h) for h in held["holdings"]],
                    profile=held["profile"],
                    running=bool(held["running"]),
                    cpu_milli=int(held["cpu_milli"]),
                    memory_mib=int(held["memory_mib"]),
                )
    return len(objects)


COST_SHARE = 0.1
"""At most this share of the time goes to writing snapshots: one that took 0.3 s of CPU is followed
by the next no sooner than 3 s later (a busy cluster of thousands of pods writes megabytes, and the
encoder holds the GIL that the API server needs)."""


class Persister:
    """Writes snapshots while the devcluster runs: every ``interval`` seconds when the store changed,
    or less often when a snapshot is costly to write (see :data:`COST_SHARE`)."""

    def __init__(self, path: Path, store: ObjectStore, ctx: SimContext, interval: float = 1.0) -> None:
        if interval <= 0:
            raise ValueError(f"interval: must be positive, got {interval}")
        self.path = path
        self._store = store
        self._ctx = ctx
        self._interval = interval
        self._written: tuple[int, int] | None = None
        self._encoder = SnapshotEncoder()
        self._saving = threading.Lock()  # the periodic save may still run when the final one starts
        self.last_cost_s = 0.0
        """CPU seconds the last snapshot took to take, encode and write."""
        store.reserve_revisions(self._reserve)

    def _reserve(self, reserved: int) -> None:
        """Record ``reserved`` before the store uses the revisions up to it (called under its lock)."""
        try:
            write(reserved_path(self.path), _dumps({"reserved": reserved}))
        except OSError as exc:  # as for a snapshot, a full disk must not stop the cluster
            log.warning(
                "cannot record the reserved resourceVersions in %s: %s; a crash may reuse them",
                reserved_path(self.path),
                exc,
            )

    @property
    def pause_s(self) -> float:
        """How long the writer waits before it looks for changes again."""
        return max(self._interval, self.last_cost_s / COST_SHARE)

    def _fingerprint(self) -> tuple[int, int]:
        with self._ctx.lock:
            running = sum(d.running for d in self._ctx.devices.values())
            return self._store.revision, hash((len(self._ctx.devices), running))

    def save(self) -> None:
        """Write a snapshot now (on the caller's thread)."""
        with self._saving:
            started = time.thread_time()
            fingerprint = self._fingerprint()
            write(self.path, self._encoder.encode(self._store, self._ctx))
            self._written = fingerprint
            self.last_cost_s = time.thread_time() - started

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.pause_s)
            if self._fingerprint() != self._written:
                try:
                    await asyncio.to_thread(self.save)
                except OSError as exc:  # a full disk must not stop the cluster; the next try may work
                    log.warning("cannot write the devcluster snapshot %s: %s", self.path, exc)

    async def final(self) -> None:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self.save)


def _node_state(node: SimNode) -> dict[str, Any]:
    return {
        "applied_mig_config": node.applied_mig_config,
        "attempted_mig_config": node.attempted_mig_config,
        "lost": node.lost,
        "replicas": node.replicas,
        "gpus": [
            {
                "mig_enabled": gpu.mig_enabled,
                "mig_instances": [asdict(m) for m in gpu.mig_instances],
                "xids": list(gpu.xids),
                "overheating": gpu.overheating,
                "lost": gpu.lost,
            }
            for gpu in node.gpus
        ],
    }


def _restore_node(node: SimNode, state: dict[str, Any]) -> None:
    node.applied_mig_config = state.get("applied_mig_config")
    node.attempted_mig_config = state.get("attempted_mig_config")
    node.lost = bool(state.get("lost", False))
    node.replicas = int(state.get("replicas", 1))
    node.mig_reconfiguring = False  # an interrupted reconfiguration is redone by the operator
    for gpu, saved in zip(node.gpus, state.get("gpus") or [], strict=False):
        gpu.mig_enabled = bool(saved.get("mig_enabled", False))
        gpu.mig_instances = tuple(MigInstance(**m) for m in saved.get("mig_instances") or [])
        gpu.xids = [int(x) for x in saved.get("xids") or []]
        gpu.overheating = bool(saved.get("overheating", False))
        gpu.lost = bool(saved.get("lost", False))
