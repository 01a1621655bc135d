"""The free-shape oracle: gangs placed whole or not at all, largest pods first, tightest node."""

from __future__ import annotations

import pytest

from tessera.admission.domain.queueing import FreeShapeOracle, NodeFree
from tessera.admission.domain.queueing.builders import a_job


def nodes(*free: int, flavor: str = "a100") -> list[NodeFree]:
    return [NodeFree(f"n{i}", flavor, f) for i, f in enumerate(free)]


@pytest.mark.parametrize(
    ("free", "per_pod", "pods", "placeable"),
    [
        pytest.param((1,) * 8, 8, 1, False, id="1x8 on eight 1-GPU holes"),
        pytest.param((1,) * 8, 1, 8, True, id="8x1 on eight 1-GPU holes"),
        pytest.param((4, 4), 8, 1, False, id="8 on two halves"),
        pytest.param((4, 4), 4, 2, True, id="2x4 on two halves"),
        pytest.param((8, 2, 2), 2, 6, True, id="six pairs"),
        pytest.param((3, 3, 3, 3), 2, 4, True, id="four pairs in four 3-GPU holes"),
        pytest.param((3, 3, 3, 3), 2, 5, False, id="five pairs do not fit in twelve GPUs as 4x3"),
    ],
)
def test_gang_fits_only_where_the_free_shape_allows(
    free: tuple[int, ...], per_pod: int, pods: int, placeable: bool
) -> None:
    oracle = FreeShapeOracle(nodes(*free))
    placement = oracle.try_place(a_job("j").gpus(per_pod, pods=pods).build(), ["a100"])
    assert (placement is not None) is placeable
    assert [oracle.free_gpus(f"n{i}") for i in range(len(free))] == list(free)


def test_pods_take_the_tightest_node_and_commit_reduces_the_view() -> None:
    oracle = FreeShapeOracle(nodes(8, 2, 4))
    placement = oracle.try_place(a_job("j").gpus(4).gpus(2).build(), ["a100", "a100"])
    assert placement is not None
    assert sorted(s.node for s in placement.slots) == ["n1", "n2"]
    oracle.commit(placement)
    assert [oracle.free_gpus(n) for n in ("n0", "n1", "n2")] == [8, 0, 0]


def test_flavors_are_kept_apart() -> None:
    oracle = FreeShapeOracle([*nodes(8, flavor="t4"), NodeFree("a", "a100", 2)])
    assert oracle.try_place(a_job("j").gpus(4).build(), ["a100"]) is None
    assert oracle.try_place(a_job("j").gpus(4).build(), ["t4"]) is not None


def test_fractional_pods_share_a_gpu_before_opening_a_new_one() -> None:
    oracle = FreeShapeOracle([NodeFree("n0", "a100", free_gpus=1, partial_gpu_milli=(300,))])
    fits_partial = oracle.try_place(a_job("j").milli(250).build(), ["a100"])
    assert fits_partial is not None
    oracle.commit(fits_partial)
    assert oracle.free_gpus("n0") == 1
    opens_whole = oracle.try_place(a_job("k").milli(600, pods=2).build(), ["a100"])
    assert opens_whole is None  # one whole GPU left, two 600-milli pods need two
    one = oracle.try_place(a_job("k").milli(600).build(), ["a100"])
    assert one is not None
    oracle.commit(one)
    assert oracle.free_gpus("n0") == 0


def test_mig_slices_are_counted_per_profile() -> None:
    oracle = FreeShapeOracle([NodeFree("n0", "a100", 0, free_mig={"1g.10gb": 2, "3g.40gb": 1})])
    assert oracle.try_place(a_job("j").mig("1g.10gb", pods=3).build(), ["a100"]) is None
    two = oracle.try_place(a_job("j").mig("1g.10gb", pods=2).build(), ["a100"])
    assert two is not None and len(two.slots) == 2
    oracle.commit(two)
    assert oracle.try_place(a_job("k").mig("1g.10gb").build(), ["a100"]) is None
    assert oracle.try_place(a_job("k").mig("3g.40gb").build(), ["a100"]) is not None
