"""Slicing under `tessera up`: a pod that asks for a MIG profile no GPU offers yet is bound within a
minute, once slicing has had an idle A100 reconfigured, and kubectl shows the node's new config."""

from __future__ import annotations

import pytest

from tests.e2e.harness import Stack, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

MIG_POD = """
apiVersion: v1
kind: Pod
metadata: {name: wants-3g-40gb, namespace: default}
spec:
  schedulerName: tessera
  containers:
    - name: main
      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
      resources: {limits: {nvidia.com/mig-3g.40gb: "1"}}
"""


def test_a_pod_asking_for_a_mig_profile_is_bound_within_a_minute_on_a_reconfigured_gpu(stack: Stack) -> None:
    stack.kubectl("apply", "-f", "-", stdin=MIG_POD)

    def bound_node() -> str:
        return stack.kubectl("get", "pod", "wants-3g-40gb", "-o", "jsonpath={.spec.nodeName}").strip()

    node = until(bound_node, "the MIG pod bound", timeout=60)
    until(
        lambda: stack.kubectl("get", "pod", "wants-3g-40gb", "-o", "jsonpath={.status.phase}") == "Running",
        "the MIG pod running on its instance",
    )
    shown = stack.kubectl("get", "node", node, "-L", "nvidia.com/mig.config,nvidia.com/mig.config.state")
    header, row = shown.splitlines()[:2]
    assert header.split()[-2:] == ["MIG.CONFIG", "MIG.CONFIG.STATE"]
    config, state = row.split()[-2:]
    assert config.startswith("tessera-") and state == "success", shown
    assert int(stack.node(node)["status"]["allocatable"]["nvidia.com/mig-3g.40gb"]) >= 1
    stack.kubectl("delete", "pod", "wants-3g-40gb", "--wait=false")
