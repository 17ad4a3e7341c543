"""The GrayRelease cross-field rules in Python, on the inputs the API-server parity test uses."""

from __future__ import annotations

import pytest

from tinct.api.crd import crd
from tinct.api.routing import RoutingTable
from tinct.api.v1alpha1 import GRAYRELEASE, GrayReleaseSpec
from tinct.api.v1alpha1.rules import walk_rules
from tinct_testing.gr_rules import CASES, Case, model_refusal, release_doc, table_refusal


def _refused_as(refusal: str | None, expected: str | None, what: str) -> None:
    """``refusal`` is None when nothing is ``expected``, else a message containing it."""
    if expected is None:
        assert refusal is None
    else:
        assert refusal is not None, f"{what} accepted it"
        assert expected in refusal


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_model_refuses_what_the_rule_forbids(case: Case) -> None:
    _refused_as(model_refusal(release_doc(case)), case.message, f"{case.id}: the model")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_routing_table_refuses_the_same_inputs(case: Case) -> None:
    _refused_as(table_refusal(release_doc(case)), case.table, f"{case.id}: the table")


def test_every_rule_has_a_case() -> None:
    release = {r.message for _, r in walk_rules(GrayReleaseSpec)}
    table = {r.message for _, r in walk_rules(RoutingTable)}
    assert release == {c.rule_message for c in CASES if c.message}
    assert table == {c.table_rule_message for c in CASES if c.table}


def test_crd_carries_every_rule_as_cel() -> None:
    def validations(node: object) -> list[dict[str, str]]:
        if isinstance(node, dict):
            found = list(node.get("x-kubernetes-validations", []))
            return found + [v for child in node.values() for v in validations(child)]
        if isinstance(node, list):
            return [v for child in node for v in validations(child)]
        return []

    in_crd = validations(crd(GRAYRELEASE))
    for _, rule in walk_rules(GrayReleaseSpec):
        assert rule.wire() in in_crd
