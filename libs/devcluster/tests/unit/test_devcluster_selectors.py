"""Label and field selectors as the API server parses them."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.selectors import FieldSelector, LabelSelector, Selector

LABELS = {"app": "web", "tier": "front", "gpu": "a100"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app=db", False),
        ("app!=db", True),
        ("missing!=x", True),
        ("app in (web, db)", True),
        ("app in (db)", False),
        ("app notin (db)", True),
        ("missing notin (db)", True),
        ("tier", True),
        ("missing", False),
        ("!missing", True),
        ("!tier", False),
        ("app=web,gpu in (a100,h100),!spot", True),
        ("app=web,gpu=h100", False),
    ],
)
def test_label_selector(selector: str, matches: bool) -> None:
    assert LabelSelector.parse(selector).matches(LABELS) is matches


@pytest.mark.parametrize("bad", ["app in web", "app in (a", "=web", "!app in (x)"])
def test_malformed_label_selectors_are_bad_requests(bad: str) -> None:
    with pytest.raises(ApiError) as caught:
        LabelSelector.parse(bad)
    assert caught.value.code == 400


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}},
    "spec": {"nodeName": "n1", "schedulerName": "tessera"},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("metadata.name=p", True),
        ("metadata.namespace=other", False),
        ("spec.nodeName=n1,status.phase!=Failed", True),
        ("spec.schedulerName=default-scheduler", False),
        ("spec.unknownField=", True),
    ],
)
def test_field_selector(selector: str, matches: bool) -> None:
    assert FieldSelector.parse(selector).matches(POD) is matches


def test_field_selectors_need_an_operator() -> None:
    with pytest.raises(ApiError) as caught:
        FieldSelector.parse("spec.nodeName")
    assert caught.value.code == 400 and "spec.nodeName" in caught.value.message


def test_a_selector_combines_labels_and_fields() -> None:
    assert Selector.parse("app=web", "spec.nodeName=n1").matches(POD)
    assert not Selector.parse("app=web", "spec.nodeName=n2").matches(POD)
    assert not Selector().matches(None)
