"""OperatorConfig from the environment and from flags; the shared defaults and cluster access."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.environ import patched_environ
from tinct.kubeconfig import choose
from tinct.lineage.root import DEFAULT_ROOT
from tinct.operator.settings import OperatorConfig


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


def test_operator_and_lineage_share_the_root_default() -> None:
    assert OperatorConfig.from_env({}).lineage_root == DEFAULT_ROOT
    out = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "lineage", "sql", "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert DEFAULT_ROOT in out


def test_operator_refuses_a_bad_flag_before_starting() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "operator", "--hash-workers", "lots"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "tinct operator: hash-workers 'lots'" in proc.stderr


def test_cluster_access_order(tmp_path: Path) -> None:
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    with patched_environ(KUBECONFIG=str(env)):
        assert choose(explicit).kubeconfig == str(explicit)
        assert choose().kubeconfig == str(env)
        assert not choose().in_cluster
    with patched_environ(KUBECONFIG=""):
        assert choose().kubeconfig == str(Path("~/.kube/config").expanduser())
