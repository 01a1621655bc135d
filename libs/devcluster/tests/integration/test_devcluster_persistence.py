"""A devcluster restarted on its state file resumes: objects, running pods and their GPUs come back."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.devcluster import persistence
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION, SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.devcluster.testing import NODE, api_client, binding_scheduler, wait_for

pytestmark = pytest.mark.integration

FAST = SimSettings(speed=50.0, pod_start_seconds=1.0)


def start(state_file: Path) -> DevCluster:
    nodes = [NodeSpec(NODE, 96_000, 1_048_576, "A100-80GB", 8, 81920, {})]
    cluster = DevCluster(
        nodes, settings=FAST, duty_cycle=DutyCycleTrace.synthetic(), podresources=False, state_file=state_file
    )
    cluster.start()
    return cluster


@pytest.fixture
def state_file(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "devcluster" / "state.json"


def pod(core: client.CoreV1Api, name: str) -> Any:
    return core.read_namespaced_pod(name, "default")


def create(core: client.CoreV1Api, manifest: PodManifest) -> None:
    core.create_namespaced_pod("default", manifest.obj())


def running(core: client.CoreV1Api, name: str) -> bool:
    return bool(pod(core, name).status.phase == "Running")


def test_a_clean_restart_keeps_running_pods_running_with_their_gpus(state_file: Path) -> None:
    first = start(state_file)
    try:
        with api_client(first) as api, binding_scheduler(api):
            core = client.CoreV1Api(api)
            create(core, PodManifest("trainer").scheduler().gpus(6))
            core.create_namespaced_config_map(
                "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"a": "1"})
            )
            wait_for(lambda: running(core, "trainer"), what="trainer Running")
            before = pod(core, "trainer")
    finally:
        first.stop()
    assert state_file.exists()

    second = start(state_file)
    try:
        assert second.restored is not None and second.restored > 0
        with api_client(second) as api, binding_scheduler(api):
            core = client.CoreV1Api(api)
            after = pod(core, "trainer")
            assert after.metadata.uid == before.metadata.uid
            assert after.status.phase == "Running"
            assert after.status.start_time == before.status.start_time
            assert core.read_namespaced_config_map("settings", "default").data == {"a": "1"}
            assert sorted(n.metadata.name for n in core.list_node().items) == [NODE]
            # the kubelet still counts the trainer's 6 GPUs: 4 more do not fit, 2 do
            create(core, PodManifest("too-big").scheduler().gpus(4))
            create(core, PodManifest("fits").scheduler().gpus(2))
            wait_for(lambda: pod(core, "too-big").status.phase == "Failed", what="too-big Failed")
            assert pod(core, "too-big").status.reason == "UnexpectedAdmissionError"
            wait_for(lambda: running(core, "fits"), what="fits Running")
            assert running(core, "trainer")
            # new writes go on from the restored revision: a stale resourceVersion is still refused
            assert int(after.metadata.resource_version) < int(pod(core, "fits").metadata.resource_version)
    finally:
        second.stop()


def test_a_killed_devcluster_resumes_from_its_last_periodic_snapshot(
    state_file: Path, tmp_path: Path
) -> None:
    killed_copy = tmp_path / "at-kill.json"
    first = start(state_file)
    try:
        with api_client(first) as api, binding_scheduler(api):
            core = client.CoreV1Api(api)
            # 150 simulated seconds: 3 s of wall-clock time at speed 50
            create(core, PodManifest("short").scheduler().gpus(1).annotate(SIM_DURATION_ANNOTATION, "150"))
            create(core, PodManifest("long").scheduler().gpus(1))
            wait_for(lambda: running(core, "short") and running(core, "long"), what="both Running")

            def snapshot_has_both_running() -> bool:
                if not state_file.exists():
                    return False
                phases = {
                    o["object"]["metadata"]["name"]: o["object"]["status"].get("phase")
                    for o in json.loads(state_file.read_text())["objects"]
                    if o["plural"] == "pods"
                }
                return phases == {"short": "Running", "long": "Running"}

            wait_for(snapshot_has_both_running, what="a periodic snapshot with both pods Running")
            # what a SIGKILL would leave behind: the last periodic snapshot, not the one written on stop
            shutil.copy(state_file, killed_copy)
    finally:
        first.stop()
    shutil.copy(killed_copy, state_file)

    second = start(state_file)
    try:
        with api_client(second) as api:
            core = client.CoreV1Api(api)
            assert running(core, "long")
            # the short pod's lifecycle resumed: it ends on time rather than running for ever
            wait_for(
                lambda: pod(core, "short").status.phase == "Succeeded", timeout=30, what="short Succeeded"
            )
            assert running(core, "long")
            core.delete_namespaced_pod("long", "default")
            wait_for(lambda: not second.ctx.devices, what="the deleted pod's GPUs released")
    finally:
        second.stop()


def configmaps(core: client.CoreV1Api) -> list[str]:
    return [c.metadata.name for c in core.list_namespaced_config_map("default").items]


def test_a_watcher_resuming_after_a_crash_is_told_to_relist_and_misses_nothing(
    state_file: Path, tmp_path: Path
) -> None:
    killed_copy = tmp_path / "at-kill.json"
    first = start(state_file)
    try:
        with api_client(first) as api:
            core = client.CoreV1Api(api)
            core.create_namespaced_config_map("default", client.V1ConfigMap(metadata={"name": "kept"}))

            def snapshot_has_kept() -> bool:
                return state_file.exists() and '"kept"' in state_file.read_text()

            wait_for(snapshot_has_kept, what="a periodic snapshot with the config map")
            shutil.copy(state_file, killed_copy)  # what a SIGKILL would leave behind
            core.create_namespaced_config_map("default", client.V1ConfigMap(metadata={"name": "ghost"}))
            seen = core.list_namespaced_config_map("default").metadata.resource_version
    finally:
        first.stop()
    shutil.copy(killed_copy, state_file)

    second = start(state_file)
    try:
        with api_client(second) as api:
            core = client.CoreV1Api(api)
            for i in range(5):  # more writes than the crash lost
                core.create_namespaced_config_map(
                    "default", client.V1ConfigMap(metadata={"name": f"new-{i}"})
                )
            # the reflector resumes from what it had seen: the server cannot replay from there
            with pytest.raises(ApiException) as caught:
                list(
                    watch.Watch().stream(
                        core.list_namespaced_config_map, "default", resource_version=seen, timeout_seconds=1
                    )
                )
            assert caught.value.status == 410
            listed = core.list_namespaced_config_map("default")
            assert [c.metadata.name for c in listed.items] == ["kept", *(f"new-{i}" for i in range(5))]
            assert all(int(c.metadata.resource_version) > int(seen) for c in listed.items[1:])
            # ... and watches on from its relist without another 410
            stream = watch.Watch().stream(
                core.list_namespaced_config_map,
                "default",
                resource_version=listed.metadata.resource_version,
                timeout_seconds=2,
            )
            core.delete_namespaced_config_map("kept", "default")
            event = next(stream)
            assert (event["type"], event["object"].metadata.name) == ("DELETED", "kept")
    finally:
        second.stop()


def test_a_clean_stop_acknowledges_no_write_its_final_snapshot_misses(state_file: Path) -> None:
    cluster = start(state_file)
    assert cluster.persister is not None
    save, url, stopping, answers = cluster.persister.save, cluster.url, threading.Event(), []

    def save_then_write() -> None:  # a client writing just after the final snapshot was taken
        save()
        if stopping.is_set():
            body = json.dumps({"metadata": {"name": f"late-{len(answers)}"}}).encode()
            request = urllib.request.Request(
                f"{url}/api/v1/namespaces/default/configmaps",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    answers.append(answer.status)
            except urllib.error.URLError:
                answers.append(None)  # refused: the server no longer serves

    cluster.persister.save = save_then_write  # type: ignore[method-assign]
    stopping.set()
    cluster.stop()

    assert answers  # the final snapshot was taken
    stored = {o["object"]["metadata"]["name"] for o in persistence.read(state_file)["objects"]}
    acknowledged = {f"late-{i}" for i, status in enumerate(answers) if status == 201}
    assert acknowledged <= stored


def test_a_snapshot_of_another_format_is_refused_by_name(state_file: Path) -> None:
    state_file.parent.mkdir(parents=True)
    state_file.write_text(json.dumps({"format": 99}))
    nodes = [NodeSpec(NODE, 96_000, 1_048_576, "A100-80GB", 8, 81920, {})]
    with pytest.raises(ValueError, match=r"state.json: format: expected 1, got 99"):
        DevCluster(nodes, settings=FAST, duty_cycle=DutyCycleTrace.synthetic(), state_file=state_file)
