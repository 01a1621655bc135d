"""The size check's fast bound never lets through a message the exact count refuses."""

from __future__ import annotations

import pytest

from tessera.core.messaging.limits import MessageTooLarge, check_fits, surely_fits, wire_size

HEADERS = [
    {},
    {"ce-id": "abc", "ce-type": "io.tessera.x.v1"},
    {" padded ": "  value  ", "ce-subject": "jöb-ü-€-𝄞"},
    {"k": "€" * 300},
]


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("body_size", [0, 10, 900])
def test_the_bound_says_fits_only_when_the_exact_size_fits(headers: dict[str, str], body_size: int) -> None:
    body = b"x" * body_size
    exact = wire_size(headers, body)
    for limit in range(max(0, exact - 5), exact + 2000, 7):
        if surely_fits(headers, body, limit):
            assert exact <= limit
    assert not surely_fits(headers, body, exact - 1)
    assert surely_fits(headers, body, 4 * exact + 64), "far from the limit, the bound alone decides"


@pytest.mark.parametrize("headers", HEADERS)
def test_check_fits_refuses_one_byte_over_and_takes_the_exact_size(headers: dict[str, str]) -> None:
    body = b"y" * 50
    exact = wire_size(headers, body)
    check_fits("s", headers, body, exact)
    with pytest.raises(MessageTooLarge, match=f"{exact} bytes"):
        check_fits("s", headers, body, exact - 1)
