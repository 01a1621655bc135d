"""Per-cycle state: what PreFilter computes once and Filter, Score and Reserve read back."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class StateKey(Generic[T]):
    """A typed key; the value type travels with the key so reads need no casts at the call site."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class CycleState:
    """Scratch data for one pod's scheduling cycle. Plugins share it by key; a new cycle starts empty."""

    __slots__ = ("_data", "skip_filter", "skip_score")

    def __init__(self) -> None:
        self._data: dict[StateKey[Any], Any] = {}
        # Plugins whose PreFilter returned Skip: their Filter is not run in this cycle.
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()

    def write(self, key: StateKey[T], value: T) -> None:
        self._data[key] = value

    def read(self, key: StateKey[T]) -> T:
        try:
            return cast(T, self._data[key])
        except KeyError:
            raise KeyError(f"cycle state has no {key.name!r}: its PreFilter did not run") from None

    def get(self, key: StateKey[T]) -> T | None:
        return cast("T | None", self._data.get(key))

    def __contains__(self, key: StateKey[Any]) -> bool:
        return key in self._data
