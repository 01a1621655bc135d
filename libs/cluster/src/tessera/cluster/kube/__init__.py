"""The Kubernetes adapter of the `Cluster` port (official `kubernetes` client)."""

from tessera.cluster.kube.adapter import KubernetesCluster, api_client

__all__ = ["KubernetesCluster", "api_client"]
