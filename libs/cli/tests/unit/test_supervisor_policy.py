"""The supervisor's restart backoff and its log prefixing."""

from __future__ import annotations

import io

import pytest

from tessera.cli.supervisor import Backoff, PrefixedWriter, ServiceSpec, Supervisor


@pytest.mark.parametrize(
    ("backoff", "crashes", "expected"),
    [
        (Backoff(initial=0.5, factor=2.0, maximum=15.0), 1, 0.5),
        (Backoff(initial=0.5, factor=2.0, maximum=15.0), 2, 1.0),
        (Backoff(initial=0.5, factor=2.0, maximum=15.0), 4, 4.0),
        (Backoff(initial=0.5, factor=2.0, maximum=15.0), 6, 15.0),
        (Backoff(initial=0.5, factor=2.0, maximum=15.0), 60, 15.0),
        (Backoff(initial=1.0, factor=1.0, maximum=5.0), 3, 1.0),
    ],
)
def test_backoff_grows_then_caps(backoff: Backoff, crashes: int, expected: float) -> None:
    assert backoff.delay(crashes) == pytest.approx(expected)


def test_backoff_rejects_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="consecutive_crashes"):
        Backoff().delay(0)


def test_prefixed_writer_aligns_names_without_colour() -> None:
    out = io.StringIO()
    write = PrefixedWriter(out, ["admission", "slicing"], colour=False)

    write("slicing", "ready")
    write("admission", "listening on 127.0.0.1:18000")

    assert out.getvalue().splitlines() == [
        "slicing   | ready",
        "admission | listening on 127.0.0.1:18000",
    ]


def test_prefixed_writer_colours_each_name_on_a_terminal() -> None:
    out = io.StringIO()
    write = PrefixedWriter(out, ["a", "b"], colour=True)

    write("a", "x")
    write("b", "y")

    first, second = out.getvalue().splitlines()
    assert first.startswith("\x1b[") and first.endswith("\x1b[0m x")
    assert second.startswith("\x1b[") and first[:5] != second[:5]


def test_prefixed_writer_is_plain_when_not_a_terminal() -> None:
    out = io.StringIO()  # isatty() is False
    PrefixedWriter(out, ["a"])("a", "x")
    assert out.getvalue() == "a | x\n"


def test_supervisor_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="unique"):
        Supervisor([ServiceSpec("a", ["true"]), ServiceSpec("a", ["true"])])
