"""OperatorConfig from the environment and from flags; the shared defaults and cluster access."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tinct.kubeconfig import choose
from tinct.operator.settings import OperatorConfig
from tinct_testing.controlplane.environ import patched_environ


def test_environment_then_flags() -> None:
    env = {"TINCT_LINEAGE_ROOT": "file:///data/lineage", "TINCT_HASH_WORKERS": "0", "TINCT_PEERING": ""}
    cfg = OperatorConfig.from_env(env)
    assert (cfg.lineage_root, cfg.hash_workers, cfg.peering) == ("/data/lineage", 1, None)
    flagged = cfg.with_flags(
        {"lineage_root": "s3://l/t", "hash_workers": "6", "peering": None, "namespace": ["x"]}
    )
    assert (flagged.lineage_root, flagged.hash_workers) == ("s3://l/t", 6)
    assert flagged.onnx_parse_limit == cfg.onnx_parse_limit


def test_bad_values_name_their_source() -> None:
    with pytest.raises(ValueError, match="TINCT_HASH_WORKERS='many'"):
        OperatorConfig.from_env({"TINCT_HASH_WORKERS": "many"})
    with pytest.raises(ValueError, match="hash-workers 'many'"):
        OperatorConfig().with_flags({"hash_workers": "many"})


def test_single_writer_lineage_is_said_explicitly() -> None:
    assert OperatorConfig.from_env({}).lineage_single_writer is False
    assert OperatorConfig.from_env({"TINCT_LINEAGE_SINGLE_WRITER": "true"}).lineage_single_writer is True
    assert OperatorConfig.from_env({"TINCT_LINEAGE_SINGLE_WRITER": "no"}).lineage_single_writer is False
    with pytest.raises(ValueError, match="TINCT_LINEAGE_SINGLE_WRITER='maybe': must be true or false"):
        OperatorConfig.from_env({"TINCT_LINEAGE_SINGLE_WRITER": "maybe"})
    assert OperatorConfig().with_flags({"lineage_single_writer": True}).lineage_single_writer is True
    # The flag left out keeps what the environment said.
    env = OperatorConfig.from_env({"TINCT_LINEAGE_SINGLE_WRITER": "1"})
    assert env.with_flags({"lineage_single_writer": None}).lineage_single_writer is True


def test_cluster_access_order(tmp_path: Path) -> None:
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    with patched_environ(KUBECONFIG=str(env)):
        assert choose(explicit).kubeconfig == str(explicit)
        assert choose().kubeconfig == str(env)
        assert not choose().in_cluster
    with patched_environ(KUBECONFIG=""):
        assert choose().kubeconfig == str(Path("~/.kube/config").expanduser())


def test_peering_priority_ranks_the_older_replica_first() -> None:
    from tinct.operator.settings import start_priority

    older, newer = start_priority(1_800_000_000_000_000_000), start_priority(1_800_000_000_000_001_000)
    assert older == newer + 1  # one microsecond apart
    assert 0 < newer < older < 2**53  # exact in any JSON reader of the peering object
    cfg = OperatorConfig.from_env({"TINCT_PEERING_PRIORITY": "7", "TINCT_PEERING_LIFETIME": "5"})
    assert (cfg.peering_priority, cfg.peering_lifetime) == (7, 5)
    assert (OperatorConfig().peering_priority, OperatorConfig().peering_lifetime) == (None, 60)
    with pytest.raises(ValueError, match="peering-lifetime '1': must be at least 3 seconds"):
        OperatorConfig().with_flags({"peering_lifetime": "1"})


def test_replicas_with_the_same_arguments_get_different_priorities() -> None:
    import kopf

    from tinct.operator.settings import configure

    cfg = OperatorConfig(peering="tinct", peering_lifetime=9)
    first, second = kopf.OperatorSettings(), kopf.OperatorSettings()
    configure(first, cfg)
    time.sleep(0.001)  # two processes never start within the same microsecond
    configure(second, cfg)
    assert first.peering.priority > second.peering.priority  # the one started first acts
    assert (first.peering.name, first.peering.mandatory, first.peering.lifetime) == ("tinct", True, 9)
    pinned = kopf.OperatorSettings()
    configure(pinned, OperatorConfig(peering="tinct", peering_priority=100))
    assert pinned.peering.priority == 100


def test_prometheus_servers_from_environment_and_flags() -> None:
    cfg = OperatorConfig.from_env(
        {
            "TINCT_PROMETHEUS_URL": "http://Prometheus.monitoring:9090/",
            "TINCT_PROMETHEUS": "fleet-b=https://prom.fleet-b:9090/prom/, edge=http://10.0.0.7:9090,",
            "TINCT_PROMETHEUS_TIMEOUT": "2.5",
        }
    )
    assert cfg.prometheus_url == "http://prometheus.monitoring:9090"
    assert cfg.prometheus == (("fleet-b", "https://prom.fleet-b:9090/prom"), ("edge", "http://10.0.0.7:9090"))
    assert cfg.prometheus_timeout == 2.5
    flagged = cfg.with_flags({"prometheus": ["a=http://a:9090"], "prometheus_url": None})
    assert flagged.prometheus == (("a", "http://a:9090"),), "the flags replace the variable's list"
    assert flagged.prometheus_url == cfg.prometheus_url
    assert (OperatorConfig().prometheus_url, OperatorConfig().prometheus) == (None, ())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TINCT_PROMETHEUS_URL": "ftp://prom"}, "http(s)://host"),
        ({"TINCT_PROMETHEUS_URL": "http://user:secret@prom"}, "may not hold credentials"),
        ({"TINCT_PROMETHEUS_URL": "http://prom/?x=1"}, "no query or fragment"),
        ({"TINCT_PROMETHEUS": "Fleet_B=http://prom"}, "'Fleet_B' is not a Prometheus name"),
        ({"TINCT_PROMETHEUS": "a=http://x,a=http://y"}, "'a' is given twice"),
        ({"TINCT_PROMETHEUS": "http://prom"}, "is not NAME=URL"),
        ({"TINCT_PROMETHEUS": "default=http://prom"}, "names the --prometheus-url one"),
        ({"TINCT_PROMETHEUS": "b=gopher://prom"}, "b: a Prometheus URL"),
        ({"TINCT_PROMETHEUS_TIMEOUT": "0"}, "more than 0"),
    ],
)
def test_bad_prometheus_settings_are_refused(env: dict[str, str], message: str) -> None:
    (variable,) = env
    with pytest.raises(ValueError, match=re.escape(variable)) as info:
        OperatorConfig.from_env(env)
    assert message in str(info.value)
