"""`tinct operator` and `tinct lineage` as commands, in a child process: a bad flag or Prometheus
is refused before anything starts, and both name the same default lineage root."""

from __future__ import annotations

from tinct.lineage.root import DEFAULT_ROOT
from tinct.operator.settings import OperatorConfig
from tinct_testing.commands import tinct


def test_operator_and_lineage_share_the_root_default() -> None:
    assert OperatorConfig.from_env({}).lineage_root == DEFAULT_ROOT
    out = tinct("lineage", "sql", "--help").stdout
    assert DEFAULT_ROOT in out


def test_operator_refuses_a_bad_flag_before_starting() -> None:
    proc = tinct("operator", "--hash-workers", "lots")
    assert proc.returncode == 2
    assert "tinct operator: hash-workers 'lots'" in proc.stderr


def test_operator_refuses_a_bad_prometheus_before_starting() -> None:
    proc = tinct("operator", "--prometheus", "fleet-b=ftp://prom")
    assert proc.returncode == 2
    assert "tinct operator: prometheus ['fleet-b=ftp://prom']: fleet-b: a Prometheus URL" in proc.stderr
