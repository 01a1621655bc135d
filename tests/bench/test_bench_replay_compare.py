"""The replay's saturated throughput and the before/after comparison's inputs."""

from __future__ import annotations

import pytest

from bench.replay import backlog_rate
from bench.replay_compare import build_parser, environment


def test_backlog_throughput_counts_binds_only_while_pods_wait() -> None:
    # 100 pods created at once, bound ten a second from t=1: 50 or more wait until the 51st bind
    # at t=6, so 51 binds in 6 s of backlog (the first second, with nothing bound, counts).
    assert backlog_rate([0.0] * 100, [1 + 0.1 * i for i in range(100)]) == 8.5
    # Bound as fast as created: no backlog forms, so there is no saturated figure.
    assert backlog_rate([0.0, 1.0, 2.0], [0.5, 1.5, 2.5]) is None
    assert backlog_rate([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], backlog=2) == 1.0


def test_paths_are_environment_assignments_and_the_old_path_is_the_default() -> None:
    args = build_parser().parse_args(["--limit", "300", "--reps", "2"])
    assert environment(args.before) == {
        "TESSERA_SCHEDULER_PIPELINED_BINDS": "false",
        "TESSERA_SCHEDULER_KUBE_CONNECTIONS": "10",
    }
    assert environment(args.after) == {} and (args.limit, args.reps) == (300, 2)
    with pytest.raises(ValueError, match="NAME=VALUE"):
        environment("TESSERA_SCHEDULER_PIPELINED_BINDS")
