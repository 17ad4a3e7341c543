"""Every GrayRelease cross-field rule, through the real API server and the Python models alike.

The CEL the API server runs and the Python check come from one :class:`~tinct.api.v1alpha1.rules.Rule`
each; this test holds the two halves to the same verdict and the same message on the same
input, for each rule and for borderline inputs that must pass (``gr_rules.CASES``).
"""

from __future__ import annotations

import pytest
import yaml

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.gr_rules import CASES, Case, model_refusal, release_doc, table_refusal


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_api_server_and_models_agree(cluster: Cluster, namespace: str, case: Case) -> None:
    doc = release_doc(case)
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False
    )
    server = None if proc.returncode == 0 else proc.stdout + proc.stderr
    model = model_refusal(doc)
    if case.message is None:
        assert server is None, f"{case.id}: the API server refused a valid release:\n{server}"
        assert model is None, f"{case.id}: the model refused a valid release:\n{model}"
        assert table_refusal(doc) is None
        return
    assert server is not None, f"{case.id}: the API server accepted it"
    assert case.message in server, f"{case.id}: {case.message!r} not in:\n{server}"
    assert model is not None, f"{case.id}: the model accepted what the API server refused"
    assert case.message in model
    table = table_refusal(doc)
    if case.table is None:
        assert table is None
    else:
        assert table is not None
        assert case.table in table
