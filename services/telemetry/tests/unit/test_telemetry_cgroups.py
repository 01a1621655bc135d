"""Host pids to pods: `/proc/<pid>/cgroup` parsed for every cgroup version and driver the kubelet
uses, processes outside Kubernetes and malformed lines, and the resolver on a proc root in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.telemetry.adapters.processes import ProcessResolver
from tessera.telemetry.domain.cgroups import (
    CgroupRef,
    PodIdentity,
    ProcessOwner,
    container_id,
    owner_of,
    parse_cgroup,
    parse_cgroup_path,
)

UID = "8f3c2a1e-5b7d-4c9e-a1f2-0123456789ab"
SYSTEMD_UID = UID.replace("-", "_")
CID = "4b1e9c0d2f3a" + "0123456789abcdef" * 3 + "abcd"  # 64 hex digits
assert len(CID) == 64


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver: containerd, CRI-O, Docker (and cri-dockerd)
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
        f"crio-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",  # Guaranteed
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-dockerd-{CID}.scope\n",
        # kind and other nested kubelets put kubepods under their own slice
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        f"0::/kubepods/pod{UID}/{CID}\n",
        # cgroup v1: one line per hierarchy, the unified line last
        f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
        f"9:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n0::/\n",
    ],
)
def test_every_driver_and_version_names_the_pod_uid_and_container_id(text: str) -> None:
    assert parse_cgroup(text) == CgroupRef(UID, CID)


def test_a_process_in_the_pods_own_cgroup_names_the_pod_only() -> None:
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == CgroupRef(UID, "")
    assert parse_cgroup_path(f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-conmon-{CID}.scope") == (
        CgroupRef(UID, "")  # CRI-O's conmon is no container
    )


def test_v1_prefers_a_line_that_names_the_container() -> None:
    text = f"3:pids:/kubepods/pod{UID}\n2:memory:/kubepods/pod{UID}/{CID}\n"
    assert parse_cgroup(text) == CgroupRef(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/nvidia-persistenced.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/\n",
        "12:memory:/docker/" + CID + "\n",  # a plain Docker container, not a pod's
        "0::/kubepods.slice/kubepods-burstable.slice\n",  # the QoS slice itself
        f"0::/system.slice/pod{UID}/{CID}\n",  # names a pod, but not under kubepods
        "",
    ],
)
def test_processes_outside_kubernetes_name_no_pod(text: str) -> None:
    assert parse_cgroup(text) is None


@pytest.mark.parametrize(
    "line",
    ["garbage", "0:/kubepods/pod", "x::/kubepods/pod" + UID, "0::kubepods/no/leading/slash"],
)
def test_a_malformed_line_is_an_error_naming_the_line(line: str) -> None:
    with pytest.raises(ValueError, match=r"cgroup line 2: expected '<hierarchy id>:<controllers>:/<path>'"):
        parse_cgroup(f"0::/\n{line}\n")


def test_container_ids_lose_the_runtimes_scheme() -> None:
    assert container_id(f"containerd://{CID}") == CID
    assert container_id(f"cri-o://{CID}") == CID
    assert container_id("") == ""


def test_owner_by_uid_and_container_id() -> None:
    pod = PodIdentity(UID, "team-a", "trainer-0", {CID: "main", "f" * 64: "sidecar"}, ["main", "sidecar"])
    pods = {UID: pod}
    assert owner_of(CgroupRef(UID, CID), pods) == ProcessOwner("team-a/trainer-0", "main")
    assert owner_of(CgroupRef(UID, "e" * 64), pods) == ProcessOwner("team-a/trainer-0", None)
    assert owner_of(CgroupRef(UID, ""), pods) == ProcessOwner("team-a/trainer-0", None)
    assert owner_of(CgroupRef("00000000-0000-0000-0000-000000000000", CID), pods) is None
    assert owner_of(None, pods) is None
    # a container the statuses do not list yet: the pod's only container
    alone = PodIdentity(UID, "team-a", "infer-0", {}, ["server"])
    assert owner_of(CgroupRef(UID, CID), {UID: alone}) == ProcessOwner("team-a/infer-0", "server")


def _proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(text)


def test_the_resolver_lists_the_pods_once_per_round_and_counts_the_unknown(tmp_path: Path) -> None:
    _proc(tmp_path, 100, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    _proc(tmp_path, 200, "0::/system.slice/dcgm.service\n")
    _proc(tmp_path, 300, "not a cgroup file\n")
    other = "11111111-2222-3333-4444-555555555555"
    _proc(tmp_path, 400, f"0::/kubepods/pod{other}/{CID}\n")  # a pod no longer on the node
    listings: list[int] = []

    def pods() -> list[PodIdentity]:
        listings.append(1)
        return [PodIdentity(UID, "team-a", "trainer-0", {CID: "main"}, ["main"])]

    resolver = ProcessResolver(pods, tmp_path)
    owners = resolver.resolve([100, 200, 300, 400, 500, 100])  # 500: no such process
    assert owners == {
        100: ProcessOwner("team-a/trainer-0", "main"),
        200: None,
        300: None,
        400: None,
        500: None,
    }
    assert (len(listings), resolver.unknown, resolver.problem) == (1, 4, None)
    assert resolver.resolve([200]) == {200: None}
    assert len(listings) == 1  # no process named a pod: the API server is not asked


def test_an_api_server_that_fails_leaves_every_pid_unknown_and_says_why(tmp_path: Path) -> None:
    _proc(tmp_path, 100, f"0::/kubepods/burstable/pod{UID}/{CID}\n")

    def pods() -> list[PodIdentity]:
        raise ConnectionError("connection refused")

    resolver = ProcessResolver(pods, tmp_path)
    assert resolver.resolve([100]) == {100: None}
    assert resolver.unknown == 1
    assert resolver.problem is not None and "connection refused" in resolver.problem


def test_a_containers_own_proc_is_not_read_as_the_hosts(tmp_path: Path) -> None:
    """Without hostPID, pid 1 is the container's own process, in a pod: NVML's host pids would name
    the wrong processes there, so none is resolved and the problem says what to do."""
    _proc(tmp_path, 1, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    _proc(tmp_path, 100, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    listings: list[int] = []

    def pods() -> list[PodIdentity]:
        listings.append(1)
        return [PodIdentity(UID, "tessera", "tessera-telemetry-x", {CID: "telemetry"}, ["telemetry"])]

    resolver = ProcessResolver(pods, tmp_path)
    assert resolver.resolve([100, 7]) == {100: None, 7: None}
    assert (resolver.unknown, listings) == (2, [])
    assert resolver.problem is not None and "hostPID" in resolver.problem
    host = tmp_path / "host"
    _proc(host, 1, "0::/init.scope\n")
    _proc(host, 100, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    assert ProcessResolver(pods, host).resolve([100]) == {
        100: ProcessOwner("tessera/tessera-telemetry-x", "telemetry")
    }
