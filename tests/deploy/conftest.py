"""Fixtures of the Helm chart tests: the chart rendered with each value set, and with the defaults."""

from __future__ import annotations

import pytest

from tests.deploy.chart import VALUE_SETS, Rendered, render


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def chart(request: pytest.FixtureRequest) -> Rendered:
    return render(VALUE_SETS[request.param])


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render(VALUE_SETS["default"])
