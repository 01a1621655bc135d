"""Reading checkpoints back: find one, check it against the live state, copy it in; `load` and `latest_uri`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.checkpoint_client.durable import latest_complete, read_manifest
from tessera.checkpoint_client.errors import CheckpointNotFound, StateMismatch
from tessera.checkpoint_client.format import Manifest
from tessera.checkpoint_client.staging import Staging, StagingPool, plan_layout
from tessera.checkpoint_client.store import Store, open_store
from tessera.checkpoint_client.tree import Flat, LeafAdapter, LeafInfo, NumpyAdapter, decode_value


def locate(
    uri: str | None,
    store: Store | None,
    store_error: str,
    job_id: str,
    storage_options: dict[str, Any] | None = None,
) -> tuple[Store, str, Manifest] | None:
    """(store, directory, manifest) of the checkpoint at `uri` (opened with `storage_options`, those of
    the storage: credentials, endpoint), else of the newest complete one of the job in `store`."""
    if uri:
        at = open_store(uri, storage_options)
        return at, at.root, read_manifest(at, at.root, job_id)
    if store is None:
        raise CheckpointNotFound(store_error)
    found = latest_complete(store, job_id)
    if found is None:
        return None
    return store, found[0], found[1]


def staging_matching(
    pool: StagingPool, adapters: Sequence[LeafAdapter], live: Flat, manifest: Manifest
) -> Staging | None:
    """The staging, when the checkpoint's layout is the one this state gets (the usual case): the restore
    reads straight into it and it is warm for the first snapshot. Otherwise a temporary buffer."""
    plan = plan_layout([(leaf.name, leaf.info.nbytes) for leaf in live.tensors if leaf.info])
    mine = [(s.name, s.offset, s.nbytes) for s in plan.slots]
    theirs = [(t.name, t.offset, t.nbytes) for t in manifest.tensors]
    if mine != theirs or plan.total_bytes != manifest.total_bytes:
        return None
    staging = pool.acquire(live, adapters, block=True)
    if staging is not None and staging.plan.signature != plan.signature:
        pool.release(staging)
        return None
    return staging


def check_state(live: Flat, manifest: Manifest, *, strict: bool = True) -> dict[str, Any]:
    """Manifest entry by name for every leaf of `live`; a mismatch raises `StateMismatch` naming the leaf."""
    tensors = {t.name: t for t in manifest.tensors}
    objects = {o.name: o for o in manifest.objects}
    entries: dict[str, Any] = {}
    for leaf in live.tensors:
        entry = tensors.get(leaf.name)
        info = leaf.info
        assert info is not None
        if entry is None:
            if leaf.name in objects:
                raise StateMismatch(leaf.name, "a tensor in the state, a plain value in the checkpoint")
            raise StateMismatch(leaf.name, "not in the checkpoint")
        if tuple(entry.shape) != info.shape:
            raise StateMismatch(
                leaf.name, f"shape {tuple(entry.shape)} in the checkpoint, {info.shape} in the state"
            )
        if entry.dtype != info.dtype:
            raise StateMismatch(
                leaf.name, f"dtype {entry.dtype} in the checkpoint, {info.dtype} in the state"
            )
        entries[leaf.name] = entry
    for leaf in live.objects:
        obj_entry = objects.get(leaf.name)
        if obj_entry is None:
            if leaf.name in tensors:
                raise StateMismatch(leaf.name, "a plain value in the state, a tensor in the checkpoint")
            inside = sorted(n for n in (*tensors, *objects) if n.startswith(leaf.name + "."))
            if inside:
                raise StateMismatch(
                    leaf.name,
                    f"empty in the state, the checkpoint holds {inside[0]} and {len(inside) - 1} more"
                    " (load() rebuilds such a state, e.g. an optimizer before its first step)",
                )
            if strict:
                raise StateMismatch(leaf.name, "not in the checkpoint")
            continue
        entries[leaf.name] = obj_entry
    if strict:
        extra = sorted((set(tensors) | set(objects)) - live.names())
        if extra:
            raise StateMismatch(extra[0], f"in the checkpoint but not in the state ({len(extra)} such)")
    return entries


def copy_into(live: Flat, manifest: Manifest, entries: dict[str, Any], arena: Any, *, own: bool) -> None:
    for leaf in live.tensors:
        entry = entries[leaf.name]
        src = arena[entry.offset : entry.offset + entry.nbytes]
        assert leaf.adapter is not None and leaf.info is not None
        if not leaf.adapter.copy_in(leaf.obj, src):
            leaf.replace(leaf.adapter.materialize(leaf.info, src if own else src.copy()))
    for leaf in live.objects:
        if leaf.name in entries:
            leaf.replace(decode_value(entries[leaf.name].value))


def load(
    uri: str, *, job_id: str | None = None, storage_options: dict[str, Any] | None = None
) -> tuple[int, dict[Any, Any]]:
    """(step, state) of one checkpoint directory as nested dicts of NumPy arrays, verified.

    The arrays are views into one buffer that belongs to the caller. Tensors whose dtype NumPy lacks
    (`torch.bfloat16`) come back as raw bytes; `tessera.checkpoint_client.torch.load` rebuilds them."""
    from tessera.checkpoint_client.durable import read_checkpoint
    from tessera.checkpoint_client.tree import parse_dtype, unflatten

    store = open_store(uri, storage_options)
    manifest = read_manifest(store, store.root, job_id)
    arena = read_checkpoint(store, store.root, manifest)
    leaves: list[tuple[Sequence[Any], object]] = []
    adapter = NumpyAdapter()
    for t in manifest.tensors:
        src = arena[t.offset : t.offset + t.nbytes]
        info = LeafInfo(tuple(t.shape), t.dtype, t.nbytes, t.kind)
        try:
            parse_dtype(t.dtype)
        except (TypeError, ValueError):
            leaves.append((t.path, src))
            continue
        leaves.append((t.path, adapter.materialize(info, src)))
    leaves += [(o.path, decode_value(o.value)) for o in manifest.objects]
    return manifest.step, unflatten(leaves)


def latest_uri(storage_url: str, job_id: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """The newest complete checkpoint of a job, or None."""
    store = open_store(storage_url, storage_options)
    found = latest_complete(store, job_id)
    return store.uri(found[0]) if found else None
