"""The emulated Kubernetes API server of the devcluster."""

from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import (
    CONFIGMAPS,
    NAMESPACES,
    NODES,
    PODGROUPS,
    PODS,
    ResourceRegistry,
    ResourceType,
)
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.apiserver.server import ApiServer, DevClusterEmulator, kubeconfig, write_kubeconfig
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.apiserver.watching import Watch

__all__ = [
    "CONFIGMAPS",
    "NAMESPACES",
    "NODES",
    "PODGROUPS",
    "PODS",
    "ApiError",
    "ApiServer",
    "DevClusterEmulator",
    "ObjectStore",
    "ResourceRegistry",
    "ResourceType",
    "Selector",
    "Watch",
    "kubeconfig",
    "write_kubeconfig",
]
