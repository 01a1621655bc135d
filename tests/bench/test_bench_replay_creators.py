"""The replay benchmark's concurrent pod creation: bounded, and rejected pods reported."""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.replay import Creators
from tessera.devcluster.replay import Replayer, ReplayReport, TracePod


def _pods(n: int) -> list[TracePod]:
    return [
        TracePod(
            name=f"p{i}",
            cpu_milli=100,
            memory_mib=64,
            num_gpu=0,
            gpu_milli=0,
            gpu_spec="",
            creation_time=float(i),
        )
        for i in range(n)
    ]


def test_creations_overlap_up_to_the_count_and_rejections_are_reported() -> None:
    lock = threading.Lock()
    running, peak, made = 0, 0, []

    def create(manifest: dict[str, Any]) -> None:
        nonlocal running, peak
        name = manifest["metadata"]["name"]
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        if name == "p3":
            raise RuntimeError("422 invalid")
        with lock:
            made.append(name)

    creators = Creators(create, 3)
    report = creators.settle(Replayer(creators.create, speed=1e6).run(_pods(12)))

    assert 1 < peak <= 3
    assert sorted(report.created) == sorted(made) and "p3" not in report.created
    assert report.failed == [("p3", "422 invalid")]


def test_one_creator_creates_in_order_on_the_callers_thread() -> None:
    threads, names = set(), []

    def create(manifest: dict[str, Any]) -> None:
        threads.add(threading.get_ident())
        names.append(manifest["metadata"]["name"])

    creators = Creators(create, 1)
    report: ReplayReport = creators.settle(Replayer(creators.create, speed=1e6).run(_pods(5)))

    assert names == report.created == [f"p{i}" for i in range(5)]
    assert threads == {threading.get_ident()}
