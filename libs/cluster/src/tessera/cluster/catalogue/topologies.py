"""Typical interconnects of GPU boards, as matrices the scheduler can rank GPU sets on.

* HGX/DGX SXM boards (A100, H100, H200, V100 with NVSwitch): every GPU reaches every other over
  NVLink through the NVSwitch fabric.
* V100 SXM2 without NVSwitch (DGX-1 hybrid cube mesh) is approximated as two NVLink-connected quads.
* PCIe servers: GPUs in pairs behind one PCIe switch (or joined by an NVLink bridge), half of the
  GPUs on each CPU socket (NUMA node), and traffic between sockets crossing the SMP interconnect.
"""

from __future__ import annotations

from enum import StrEnum

from tessera.cluster.domain.topology import InterconnectMatrix, Link


class BoardKind(StrEnum):
    NVSWITCH = "nvswitch"
    NVLINK_QUADS = "nvlink-quads"
    PCIE = "pcie"
    PCIE_NVLINK_BRIDGE = "pcie-nvlink-bridge"


def nvswitch_board(size: int = 8) -> InterconnectMatrix:
    """All-to-all NVLink through NVSwitch (HGX A100/H100/H200)."""
    return InterconnectMatrix.uniform(size, Link.NVLINK)


def pcie_board(size: int, *, nvlink_bridge_pairs: bool = False, numa_nodes: int = 2) -> InterconnectMatrix:
    """A PCIe server: consecutive pairs share a switch (or an NVLink bridge); GPUs split across NUMA nodes."""
    if size < 1:
        raise ValueError(f"size: must be >= 1, got {size}")
    if numa_nodes < 1:
        raise ValueError(f"numa_nodes: must be >= 1, got {numa_nodes}")
    per_numa = max(1, -(-size // numa_nodes))
    pair_link = Link.NVLINK if nvlink_bridge_pairs else Link.PCIE_SWITCH

    def link(a: int, b: int) -> Link:
        if a == b:
            return Link.SELF
        if a // 2 == b // 2:
            return pair_link
        if a // per_numa == b // per_numa:
            return Link.PCIE_HOST
        return Link.CROSS_NUMA

    return InterconnectMatrix(tuple(tuple(link(a, b) for b in range(size)) for a in range(size)))


def nvlink_quads_board(size: int = 8) -> InterconnectMatrix:
    """DGX-1 style: two NVLink-connected groups of four, joined across sockets."""

    def link(a: int, b: int) -> Link:
        if a == b:
            return Link.SELF
        return Link.NVLINK if a // 4 == b // 4 else Link.CROSS_NUMA

    return InterconnectMatrix(tuple(tuple(link(a, b) for b in range(size)) for a in range(size)))


_SXM_MODELS = {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}


def typical_board(gpu_model: str, gpu_count: int, *, sxm: bool | None = None) -> InterconnectMatrix:
    """The usual wiring for ``gpu_count`` GPUs of a model.

    8-GPU boards of data-centre models (A100, H100, H200) are SXM with NVSwitch unless ``sxm`` is
    False; V100 boards of 8 are hybrid cube meshes; everything else is a PCIe server.
    """
    if gpu_count < 1:
        raise ValueError(f"gpu_count: must be >= 1, got {gpu_count}")
    if gpu_count == 1:
        return InterconnectMatrix.uniform(1, Link.SELF)
    is_sxm = sxm if sxm is not None else (gpu_model in _SXM_MODELS and gpu_count in (4, 8))
    if is_sxm:
        return nvswitch_board(gpu_count)
    if gpu_model.startswith("V100") and gpu_count == 8 and sxm is None:
        return nvlink_quads_board(gpu_count)
    return pcie_board(gpu_count, numa_nodes=2 if gpu_count >= 4 else 1)
