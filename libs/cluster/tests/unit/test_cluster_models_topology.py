"""GPU model resolution, typical board wiring and the best k-GPU set."""

from __future__ import annotations

import pytest

from tessera.cluster.catalogue import (
    CATALOGUE,
    model,
    nvlink_quads_board,
    nvswitch_board,
    pcie_board,
    resolve_product,
    typical_board,
)
from tessera.cluster.domain import InterconnectMatrix, Link


@pytest.mark.parametrize(
    ("product", "memory", "expected"),
    [
        ("Tesla-T4", None, "T4"),
        ("NVIDIA-A10", None, "A10"),
        ("NVIDIA-L4", None, "L4"),
        ("Tesla-V100-SXM2-16GB", None, "V100-16GB"),
        ("Tesla-V100-SXM2-32GB", None, "V100-32GB"),
        ("Tesla-V100-PCIE", 32768, "V100-32GB"),
        ("NVIDIA-A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe", None, "A100-80GB"),
        ("NVIDIA-A100-PCIE", 81920, "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None, "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB-SHARED", None, "A100-80GB"),
        ("NVIDIA-A30", None, "A30"),
        ("NVIDIA-H100-80GB-HBM3", None, "H100-80GB"),
        ("NVIDIA-H100-PCIe", None, "H100-80GB"),
        ("NVIDIA-H200", None, "H200-141GB"),
        ("V100M16", None, "V100-16GB"),
        ("P100", None, "P100"),
    ],
)
def test_products_resolve_to_catalogue_models(product: str, memory: int | None, expected: str) -> None:
    resolved = resolve_product(product, memory)
    assert resolved.known
    assert resolved.name == expected


def test_unknown_products_keep_their_name_and_reported_memory() -> None:
    for product in ("G2", "NVIDIA-H100-NVL", "NVIDIA-B200"):
        resolved = resolve_product(product, 12345)
        assert not resolved.known
        assert resolved.name == product
        assert resolved.memory_mib == 12345
        assert resolved.mig is None


def test_model_lookup_accepts_aliases_and_reports_unknown() -> None:
    assert model("V100M32") is CATALOGUE["V100-32GB"]
    assert model("a100-80gb") is CATALOGUE["A100-80GB"]
    assert not model("G3").known


def test_nvswitch_board_prefers_no_subset() -> None:
    matrix = nvswitch_board(8)
    assert matrix.best_gpu_set(4) == (0, 1, 2, 3)
    assert matrix.best_gpu_set(3, [7, 5, 2, 6]) == (2, 5, 6)


def test_pcie_board_keeps_pairs_and_numa_nodes_together() -> None:
    matrix = pcie_board(8)
    assert matrix.link(0, 1) is Link.PCIE_SWITCH
    assert matrix.link(0, 2) is Link.PCIE_HOST
    assert matrix.link(3, 4) is Link.CROSS_NUMA
    # GPU 0 is busy: a pair is still whole at (2, 3); a 4-set stays on the second socket.
    assert matrix.best_gpu_set(2, [1, 2, 3, 4, 6]) == (2, 3)
    assert matrix.best_gpu_set(4, [1, 2, 3, 4, 5, 6, 7]) == (4, 5, 6, 7)


def test_nvlink_bridge_pairs_beat_plain_pcie_pairs() -> None:
    matrix = pcie_board(4, nvlink_bridge_pairs=True, numa_nodes=1)
    assert matrix.link(2, 3) is Link.NVLINK
    assert matrix.best_gpu_set(2, [0, 2, 3]) == (2, 3)


def test_best_set_is_none_when_too_few_and_rejects_bad_input() -> None:
    matrix = nvlink_quads_board()
    assert matrix.best_gpu_set(3, [0, 1]) is None
    with pytest.raises(ValueError, match="k: must be >= 1"):
        matrix.best_gpu_set(0)
    with pytest.raises(ValueError, match="outside"):
        matrix.best_gpu_set(1, [9])


def test_large_boards_fall_back_to_a_greedy_choice_that_stays_in_an_island() -> None:
    size = 32
    islands = InterconnectMatrix(
        tuple(
            tuple(
                Link.SELF if a == b else Link.NVLINK if a // 8 == b // 8 else Link.CROSS_NUMA
                for b in range(size)
            )
            for a in range(size)
        )
    )
    chosen = islands.best_gpu_set(8, range(4, 32))
    assert chosen is not None
    assert len({g // 8 for g in chosen}) == 1


def test_matrix_parsed_from_nvidia_smi_rows() -> None:
    matrix = InterconnectMatrix.from_rows([["X", "NV12", "SYS"], ["NV12", "X", "PXB"], ["SYS", "PXB", "X"]])
    assert matrix.link(0, 1) is Link.NVLINK
    assert matrix.link(1, 2) is Link.PCIE_SWITCH
    assert matrix.link(0, 2) is Link.CROSS_NUMA


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([["X", "NV1"], ["PIX", "X"]], "not symmetric"),
        ([["NV1", "NV1"], ["NV1", "X"]], "diagonal"),
        ([["X"], ["X", "X"]], "columns"),
        ([["X", "QPI?"], ["QPI?", "X"]], "unknown link"),
    ],
)
def test_malformed_matrices_are_rejected(rows: list[list[str]], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        InterconnectMatrix.from_rows(rows)


def test_typical_boards_by_model() -> None:
    assert typical_board("H100-80GB", 8) == nvswitch_board(8)
    assert typical_board("V100-32GB", 8) == nvlink_quads_board(8)
    assert typical_board("T4", 4).link(0, 3) is Link.CROSS_NUMA
    assert typical_board("A100-80GB", 8, sxm=False).link(0, 1) is Link.PCIE_SWITCH
