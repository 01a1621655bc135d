"""What a state is made of: nested mappings whose leaves are tensors (raw bytes) or small plain values.

`flatten` walks a state once and names every leaf with its dotted path (`model.layer1.weight`,
`optim.state.0.exp_avg`). Tensors are whatever a `LeafAdapter` recognises: NumPy arrays, NumPy scalars
and objects with the buffer protocol here; torch tensors in `tessera.checkpoint_client.torch`. Other
leaves must be plain values (None, bool, int, float, str and lists/tuples of them, such as an
optimizer's `param_groups`); they travel as JSON in the manifest (inf and NaN as `Infinity`, `NaN`).
This module never imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Key = str | int
Path = tuple[Key, ...]
Bytes = npt.NDArray[np.uint8]

_TUPLE_TAG = "__tuple__"


@dataclass(frozen=True)
class LeafInfo:
    """How a tensor leaf is laid out: the bytes it takes and what they mean."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: str


class LeafAdapter(Protocol):
    """Knows one family of tensors: describes them, copies them into staging and back."""

    kind: str

    def describe(self, obj: object) -> LeafInfo | None:
        """The leaf's layout, or None when the object is not one of this adapter's tensors."""

    def copy_out(self, obj: object, dst: Bytes) -> None:
        """Copy the tensor's bytes into `dst` (staging); may be asynchronous until `end_copy`'s fence."""

    def copy_in(self, obj: object, src: Bytes) -> bool:
        """Write `src` into the tensor in place; False when it cannot be written (immutable)."""

    def materialize(self, info: LeafInfo, src: Bytes) -> object:
        """A new tensor holding `src` (which the caller owns and does not reuse)."""

    def staging_kind(self, leaves: Sequence[object]) -> str | None:
        """The staging memory these leaves (this adapter's) want, such as "pinned"; None for plain host memory."""

    def allocate(self, nbytes: int, kind: str) -> Bytes:
        """`nbytes` of staging memory of the kind `staging_kind` asked for, touched once (no first-touch later)."""

    def begin_copy(self) -> None:
        """Called before a snapshot's copies."""

    def end_copy(self) -> Callable[[], None] | None:
        """Called after them: a fence the flush thread calls before it reads staging, or None."""


class NumpyAdapter:
    """NumPy arrays and scalars, and any object with the buffer protocol (bytes, bytearray, array.array)."""

    kind = "numpy"

    def describe(self, obj: object) -> LeafInfo | None:
        arr = _as_array(obj)
        if arr is None:
            return None
        if arr.dtype.hasobject:
            raise TypeError(f"arrays of Python objects cannot be checkpointed (dtype {arr.dtype})")
        kind = "bytes" if isinstance(obj, bytes) else self.kind
        return LeafInfo(tuple(arr.shape), dtype_name(arr.dtype), arr.nbytes, kind)

    def copy_out(self, obj: object, dst: Bytes) -> None:
        arr = _as_array(obj)
        assert arr is not None
        if arr.nbytes:
            np.copyto(dst.view(arr.dtype).reshape(arr.shape), arr, casting="no")

    def copy_in(self, obj: object, src: Bytes) -> bool:
        if isinstance(obj, np.generic | bytes):
            return False
        arr = _as_array(obj)
        if arr is None or not arr.flags.writeable:
            return False
        if arr.nbytes:
            np.copyto(arr, src.view(arr.dtype).reshape(arr.shape), casting="no")
        return True

    def materialize(self, info: LeafInfo, src: Bytes) -> object:
        if info.kind == "bytes":
            return src.tobytes()
        dtype = parse_dtype(info.dtype)
        arr = src.view(dtype).reshape(info.shape) if info.nbytes else np.empty(info.shape, dtype)
        return arr[()] if info.shape == () else arr

    def staging_kind(self, leaves: Sequence[object]) -> str | None:
        return None

    def allocate(self, nbytes: int, kind: str) -> Bytes:
        raise NotImplementedError(kind)

    def begin_copy(self) -> None:
        return None

    def end_copy(self) -> Callable[[], None] | None:
        return None


def _as_array(obj: object) -> np.ndarray[Any, Any] | None:
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, np.generic):
        return np.asarray(obj)
    if isinstance(obj, str | int | float | bool) or obj is None:
        return None
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return None
    try:
        return np.asarray(view)
    except (ValueError, TypeError):
        return np.frombuffer(view.cast("B"), dtype=np.uint8)


def dtype_name(dtype: np.dtype[Any]) -> str:
    """A NumPy dtype as the manifest spells it: the `.npy` descr (`<f4`, `|u1`), JSON for structured ones."""
    descr = np.lib.format.dtype_to_descr(dtype)
    return descr if isinstance(descr, str) else "json:" + json.dumps(descr)


def parse_dtype(name: str) -> np.dtype[Any]:
    if name.startswith("json:"):
        return np.lib.format.descr_to_dtype([tuple(f) for f in json.loads(name[5:])])
    return np.dtype(name)


@dataclass
class Leaf:
    """One leaf of a state: where it sits (to replace it on restore) and, for a tensor, its adapter."""

    name: str
    path: Path
    parent: Mapping[Any, Any]
    key: Key
    obj: object
    adapter: LeafAdapter | None = None
    info: LeafInfo | None = None

    def replace(self, value: object) -> None:
        if not isinstance(self.parent, MutableMapping):
            raise TypeError(f"{self.name}: cannot be restored, its mapping is read-only")
        self.parent[self.key] = value


@dataclass
class Flat:
    tensors: list[Leaf]
    objects: list[Leaf]

    def names(self) -> set[str]:
        return {leaf.name for leaf in self.tensors} | {leaf.name for leaf in self.objects}


def flatten(state: Mapping[Any, Any], adapters: Sequence[LeafAdapter]) -> Flat:
    """Every leaf of `state` in a stable order (the mapping's own order), named by its dotted path."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a state is a mapping of names to tensors, not {type(state).__name__}")
    flat = Flat([], [])
    seen: set[str] = set()
    for path, parent, key, obj in _walk(state, ()):
        name = ".".join(str(k) for k in path)
        if name in seen:
            raise ValueError(f"{name}: two leaves have this name (a key holds a dot)")
        seen.add(name)
        if isinstance(obj, Mapping):  # an empty mapping: kept so that load() gives it back
            flat.objects.append(Leaf(name, path, parent, key, {}))
            continue
        for adapter in adapters:
            try:
                info = adapter.describe(obj)
            except TypeError as exc:
                raise TypeError(f"{name}: {exc}") from None
            if info is not None:
                flat.tensors.append(Leaf(name, path, parent, key, obj, adapter, info))
                break
        else:
            flat.objects.append(Leaf(name, path, parent, key, encode_value(obj, name)))
    return flat


def _walk(node: Mapping[Any, Any], prefix: Path) -> Iterator[tuple[Path, Mapping[Any, Any], Key, object]]:
    for key, value in node.items():
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(f"{'.'.join(map(str, prefix)) or '(root)'}: key {key!r} is not a str or an int")
        path = (*prefix, key)
        if isinstance(value, Mapping) and value:
            yield from _walk(value, path)
        else:
            yield path, node, key, value


def encode_value(value: object, name: str) -> Any:
    """A plain leaf as JSON; tuples keep their type, anything holding a tensor is refused."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, tuple):
        return {_TUPLE_TAG: [encode_value(v, name) for v in value]}
    if isinstance(value, list):
        return [encode_value(v, name) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{name}: a mapping inside a list needs str keys")
        return {k: encode_value(v, name) for k, v in value.items()}
    raise TypeError(
        f"{name}: cannot checkpoint a {type(value).__name__}: leaves are tensors (NumPy, buffer protocol"
        " or an adapter's) or plain values; put tensors in a mapping, not a list"
    )


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE_TAG}:
            return tuple(decode_value(v) for v in value[_TUPLE_TAG])
        return {k: decode_value(v) for k, v in value.items()}
    return value


def unflatten(leaves: Sequence[tuple[Sequence[Key], object]]) -> dict[Any, Any]:
    """Nested dicts from (path, value) pairs; the inverse of `flatten` for a state of plain dicts."""
    root: dict[Any, Any] = {}
    for path, value in leaves:
        node = root
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ValueError(f"{'.'.join(map(str, path))}: a leaf and a mapping share a path")
            node = child
        node[path[-1]] = value
    return root
