"""The object store's indexes: the objects of each type, and who owns what.

Lists and watches read only their type's objects; controllers and the garbage collector find the
objects whose ownerReferences name a uid without scanning the store. The store keeps them under its
lock, updating them on every commit and removal.
"""

from __future__ import annotations

from typing import Any

from tessera.devcluster.apiserver.resources import ResourceType

Key = tuple[ResourceType, str, str]  # type, namespace ("" when cluster-scoped), name


class StoreIndexes:
    def __init__(self) -> None:
        self._typed: dict[ResourceType, dict[Key, dict[str, Any]]] = {}
        self._owned: dict[str, set[Key]] = {}

    def of_type(self, resource: ResourceType) -> list[tuple[Key, dict[str, Any]]]:
        """The type's objects, sorted by namespace and name."""
        return sorted(self._typed.get(resource, {}).items(), key=lambda kv: kv[0][1:])

    def owned(self, owner_uid: str, resource: ResourceType | None = None) -> list[Key]:
        """The keys of the objects whose ownerReferences name the uid, by namespace and name."""
        return sorted(
            (k for k in self._owned.get(owner_uid, ()) if resource is None or k[0] == resource),
            key=lambda k: (k[1], k[2], k[0].plural),
        )

    def stored(self, key: Key, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        self._typed.setdefault(key[0], {})[key] = new
        self._reindex_owners(key, old, new)

    def removed(self, key: Key, old: dict[str, Any]) -> None:
        del self._typed[key[0]][key]
        self._reindex_owners(key, old, None)

    def _reindex_owners(self, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        before, after = _owner_uids(old), _owner_uids(new)
        for uid in before - after:
            keys = self._owned.get(uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._owned[uid]
        for uid in after - before:
            self._owned.setdefault(uid, set()).add(key)


def _owner_uids(obj: dict[str, Any] | None) -> set[str]:
    if obj is None:
        return set()
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(r["uid"]) for r in refs if isinstance(r, dict) and r.get("uid")}
