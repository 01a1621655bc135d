"""torch `state_dict`s, GPU tensors included (`pip install 'tessera-checkpoint-client[torch]'`).

    from tessera.checkpoint_client.torch import Checkpointer
    ckpt = Checkpointer(job_id, "s3://bucket/ckpt", nats_url=os.environ.get("TESSERA_NATS_URL"))
    state = {"model": model, "optim": optimizer, "sched": scheduler}   # objects with state_dict()
    start = ckpt.restore(state)                                         # load_state_dict() on each
    for step in range(start, total):
        ...
        ckpt.step(step + 1, state)

GPU tensors are copied into pinned host staging allocated once, with non-blocking device-to-host copies
on a dedicated CUDA stream that first waits for the compute stream. `step` returns once the copies are
enqueued; the compute stream then waits for the copy stream on the GPU (so the optimizer cannot change a
tensor before it is copied, without the CPU waiting), and the flush thread synchronises the copy stream
before it reads the staging. CPU tensors are copied by torch (any dtype, bfloat16 included).

`TesseraStager` brings the same reusable pinned staging to `torch.distributed.checkpoint.async_save`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from tessera.checkpoint_client import checkpointer as core
from tessera.checkpoint_client.durable import read_checkpoint
from tessera.checkpoint_client.errors import StateMismatch
from tessera.checkpoint_client.format import Manifest
from tessera.checkpoint_client.staging import StagingPool
from tessera.checkpoint_client.store import open_store
from tessera.checkpoint_client.tree import (
    Bytes,
    Flat,
    Leaf,
    LeafAdapter,
    LeafInfo,
    NumpyAdapter,
    decode_value,
    unflatten,
)

PINNED = "pinned"

_NUMPY_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "<f8",
    torch.float32: "<f4",
    torch.float16: "<f2",
    torch.int64: "<i8",
    torch.int32: "<i4",
    torch.int16: "<i2",
    torch.int8: "|i1",
    torch.uint8: "|u1",
    torch.bool: "|b1",
    torch.complex64: "<c8",
    torch.complex128: "<c16",
}
_BY_NAME: dict[str, torch.dtype] = {v: k for k, v in _NUMPY_DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest's dtype: NumPy's name where NumPy has the type (so either side can read it), else torch's."""
    return _NUMPY_DTYPES.get(dtype) or str(dtype)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a manifest dtype; raw bytes (uint8) for a NumPy type torch lacks."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name.startswith("torch."):
        found = getattr(torch, name.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
        raise ValueError(f"unknown torch dtype {name}")
    return _BY_NAME.get(np.dtype(name).str, torch.uint8)


def _plain(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter)


class TorchAdapter:
    """Dense torch tensors on any device; pinned staging and a copy stream when some are on a GPU."""

    kind = "torch"

    def __init__(self) -> None:
        self._stream: Any = None
        self._cuda_copies = False

    def describe(self, obj: object) -> LeafInfo | None:
        if not isinstance(obj, torch.Tensor):
            return None
        if not _plain(obj) or obj.layout != torch.strided or obj.is_quantized:
            raise TypeError(
                f"a {type(obj).__name__} ({obj.layout}) is not a dense tensor; stage its local shard"
            )
        return LeafInfo(tuple(obj.shape), dtype_name(obj.dtype), obj.numel() * obj.element_size(), self.kind)

    def _target(self, obj: torch.Tensor, dst: Bytes) -> torch.Tensor:
        """A tensor of `obj`'s dtype and shape over the staging bytes `dst` (a slice of the pinned tensor
        itself when the arena is pinned, so that CUDA sees pinned memory and copies asynchronously)."""
        base: Any = dst
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, torch.Tensor):
            offset = dst.__array_interface__["data"][0] - base.data_ptr()
            raw = base[offset : offset + dst.nbytes]
        else:
            raw = torch.from_numpy(dst)
        return raw.view(obj.dtype).view(obj.shape)

    def copy_out(self, obj: object, dst: Bytes) -> None:
        assert isinstance(obj, torch.Tensor)
        target = self._target(obj, dst)
        with torch.no_grad():
            if obj.is_cuda:
                self._cuda_copies = True
                with torch.cuda.stream(self._copy_stream()):
                    target.copy_(obj, non_blocking=True)
            else:
                target.copy_(obj)

    def copy_in(self, obj: object, src: Bytes) -> bool:
        assert isinstance(obj, torch.Tensor)
        source = torch.from_numpy(src).view(obj.dtype).view(obj.shape) if obj.numel() else None
        if source is not None:
            with torch.no_grad():
                obj.copy_(source)
        return True

    def materialize(self, info: LeafInfo, src: Bytes) -> object:
        return _from_bytes(src, info.dtype, info.shape)

    def staging_kind(self, leaves: Sequence[object]) -> str | None:
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in leaves) and torch.cuda.is_available():
            return PINNED
        return None

    def allocate(self, nbytes: int, kind: str) -> Bytes:
        assert kind == PINNED
        pinned = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
        pinned.zero_()
        return cast(Bytes, pinned.numpy())  # its .base is the pinned tensor, which `_target` slices

    def _copy_stream(self) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def begin_copy(self) -> None:
        self._cuda_copies = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._copy_stream().wait_stream(torch.cuda.current_stream())  # copies see finished compute

    def end_copy(self) -> Callable[[], None] | None:
        if not self._cuda_copies:
            return None
        done = torch.cuda.Event()
        done.record(self._stream)
        torch.cuda.current_stream().wait_stream(self._stream)  # no in-place update before it is copied
        return cast(Callable[[], None], done.synchronize)


def _from_bytes(src: Bytes, dtype: str, shape: Sequence[int]) -> torch.Tensor:
    t = torch_dtype(dtype)
    raw = torch.from_numpy(src)
    if t == torch.uint8 and dtype != "|u1":
        return raw  # a NumPy type torch lacks (structured...): its raw bytes
    if not int(np.prod(shape)):
        return torch.empty(tuple(shape), dtype=t)
    return raw.view(t).view(tuple(shape))


def _stateful(obj: object) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def state_dicts(state: Mapping[Any, Any]) -> dict[Any, Any]:
    """The state with every module, optimizer or scheduler replaced by its `state_dict()`."""
    return {k: v.state_dict() if _stateful(v) else v for k, v in state.items()}


class Checkpointer(core.Checkpointer):
    """`tessera.checkpoint_client.Checkpointer` for torch: tensors on any device, and `Stateful` values
    (anything with `state_dict()`/`load_state_dict()`, such as modules, optimizers, schedulers)."""

    def __init__(self, *args: Any, adapters: Sequence[LeafAdapter] = (), **kwargs: Any) -> None:
        self.torch_adapter = TorchAdapter()
        super().__init__(*args, adapters=[self.torch_adapter, *adapters], **kwargs)

    def step(self, step: int, state: core.State) -> bool:
        return super().step(step, lambda: state_dicts(state() if callable(state) else state))

    def save(self, step: int, state: core.State, *, wait: bool = False) -> core.CheckpointResult | None:
        return super().save(step, lambda: state_dicts(state() if callable(state) else state), wait=wait)

    def prepare(self, state: core.State) -> None:
        super().prepare(lambda: state_dicts(state() if callable(state) else state))

    def restore(self, state: core.State, *, uri: str | None = None, strict: bool = True) -> int:
        """Load into `state`: `load_state_dict` on its Stateful values, in place into its tensors."""
        live = state() if callable(state) else state
        if not any(_stateful(v) for v in live.values()):
            return super().restore(live, uri=uri, strict=strict)
        found = self._locate(uri or os.environ.get(core.ENV_URI) or None)
        if found is None:
            return 0
        store, directory, manifest = found
        tree = tensors_from(manifest, read_checkpoint(store, directory, manifest))
        for key, value in live.items():
            if key not in tree:
                raise StateMismatch(str(key), "not in the checkpoint")
            if _stateful(value):
                value.load_state_dict(tree[key])
            else:
                _assign(str(key), value, tree[key])
        return manifest.step


def _assign(name: str, live: Any, saved: Any) -> None:
    if isinstance(live, torch.Tensor):
        if not isinstance(saved, torch.Tensor) or tuple(saved.shape) != tuple(live.shape):
            raise StateMismatch(
                name, f"shape {getattr(saved, 'shape', None)} in the checkpoint, {live.shape} here"
            )
        if saved.dtype != live.dtype:
            raise StateMismatch(name, f"dtype {saved.dtype} in the checkpoint, {live.dtype} here")
        with torch.no_grad():
            live.copy_(saved)
    elif isinstance(live, dict):
        for k, v in live.items():
            if k not in saved:
                raise StateMismatch(f"{name}.{k}", "not in the checkpoint")
            if isinstance(v, torch.Tensor | dict):
                _assign(f"{name}.{k}", v, saved[k])
            else:
                live[k] = saved[k]


def tensors_from(manifest: Manifest, arena: Bytes) -> dict[Any, Any]:
    """The checkpoint as nested dicts of CPU tensors (views into `arena`) and plain values."""
    leaves: list[tuple[Sequence[Any], object]] = [
        (t.path, _from_bytes(arena[t.offset : t.offset + t.nbytes], t.dtype, t.shape))
        for t in manifest.tensors
    ]
    leaves += [(o.path, decode_value(o.value)) for o in manifest.objects]
    return unflatten(leaves)


def load(
    uri: str,
    *,
    job_id: str | None = None,
    map_location: str | torch.device | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[int, Any]:
    """(step, state dict of tensors) of one checkpoint directory, verified; tensors on `map_location`.
    `storage_options` go to fsspec (credentials, endpoint), as for `Checkpointer`."""
    from tessera.checkpoint_client.durable import read_manifest

    store = open_store(uri, storage_options)
    manifest = read_manifest(store, store.root, job_id)
    tree = tensors_from(manifest, read_checkpoint(store, store.root, manifest))
    if map_location is not None:
        tree = _map(tree, lambda t: t.to(map_location))
    return manifest.step, tree


def _map(tree: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    return fn(tree) if isinstance(tree, torch.Tensor) else tree


# --- torch.distributed.checkpoint ----------------------------------------------------------------------

try:
    from torch.distributed.checkpoint.staging import AsyncStager
except ImportError:  # pragma: no cover - torch built without distributed
    AsyncStager = object  # type: ignore[misc,assignment]


class TesseraStager(AsyncStager):  # type: ignore[misc,valid-type]
    """An `AsyncStager` for `dcp.async_save` that stages into Tessera's reusable (pinned) buffers.

        stager = TesseraStager()
        future = dcp.async_save(state_dict, checkpoint_id=path, async_stager=stager)
        ...
        future.result()          # before the next async_save: the staging is reused

    `stage` enqueues the copies (non-blocking from GPUs on a copy stream) and returns a state dict of
    CPU tensors viewing the staging, allocated on the first call and reused after; `async_save` then
    calls `synchronize_staging`, which waits for the copies. Non-tensor values are deep-copied. The
    staging is reused by the next `stage`, so the previous upload must have finished (wait for its
    future, as DCP asks for any stager that caches its buffers)."""

    _synchronize_after_execute = True

    def __init__(self) -> None:
        self.adapter = TorchAdapter()
        self.pool = StagingPool(1)
        self._fence: Callable[[], None] | None = None
        self._held: Any = None

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if self._held is not None:  # the previous stage's buffers go back to the pool
            self.pool.release(self._held)
            self._held = None
        leaves: list[Leaf] = []
        _collect(state_dict, (), leaves, self.adapter)
        flat = Flat(leaves, [])
        adapters: list[LeafAdapter] = [self.adapter, NumpyAdapter()]
        staging = self.pool.acquire(flat, adapters, block=True)
        assert staging is not None
        self.adapter.begin_copy()
        staged: dict[int, torch.Tensor] = {}
        for leaf, view in zip(leaves, staging.views, strict=True):
            tensor = leaf.obj
            assert isinstance(tensor, torch.Tensor)
            self.adapter.copy_out(tensor, view)
            staged[id(tensor)] = self.adapter._target(tensor, view)
        self._fence = self.adapter.end_copy()
        self._held = staging
        return _rebuild(state_dict, staged)  # type: ignore[no-any-return]

    def synchronize_staging(self) -> None:
        fence, self._fence = self._fence, None
        if fence is not None:
            fence()

    def close(self) -> None:
        self.synchronize_staging()
        self.pool = StagingPool(1)
        self._held = None


def _collect(node: Any, path: tuple[Any, ...], out: list[Leaf], adapter: TorchAdapter) -> None:
    if isinstance(node, Mapping):
        for k, v in node.items():
            _collect(v, (*path, k), out, adapter)
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            _collect(v, (*path, i), out, adapter)
    elif isinstance(node, torch.Tensor):
        name = ".".join(map(str, path))
        try:
            info = adapter.describe(node)
        except TypeError as exc:
            raise TypeError(f"{name}: {exc}") from None
        out.append(Leaf(name, path, {}, path[-1] if path else "", node, adapter, info))


def _rebuild(node: Any, staged: dict[int, torch.Tensor]) -> Any:
    if isinstance(node, dict):  # OrderedDict too
        return type(node)((k, _rebuild(v, staged)) for k, v in node.items())
    if isinstance(node, Mapping):
        return {k: _rebuild(v, staged) for k, v in node.items()}
    if isinstance(node, list):
        return [_rebuild(v, staged) for v in node]
    if isinstance(node, tuple):
        return tuple(_rebuild(v, staged) for v in node)
    if isinstance(node, torch.Tensor):
        return staged[id(node)]
    return copy.deepcopy(node)
