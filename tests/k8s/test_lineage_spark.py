"""Lineage beyond one machine: Spark with Delta's connector reads the tables the operator
wrote and gets the same rows as ``tinct lineage sql``, time travel included.

Spark runs in local mode with ``io.delta:delta-spark`` resolved by its own
``spark.jars.packages`` (cached under ~/.cache/tinct/ivy), one session for the module.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.release_cluster import (
    NO_METRICS,
    apply,
    backends,
    example,
    get,
    modelversion,
    operator,
    wait_release,
)
from tinct_testing.wait import WAIT, eventually

DELTA_SPARK = "io.delta:delta-spark_2.13:4.4.0"
COLUMNS = {
    "model_versions": ["event_id", "event", "model", "version", "uid", "generation", "onnx_sha256"],
    "artifacts": ["event_id", "uri", "format", "sha256", "size"],
    "release_events": [
        "event_id",
        "release",
        "from_model_version",
        "to_model_version",
        "step",
        "state",
        "weights",
    ],
}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    import shutil

    from pyspark.sql import SparkSession

    if shutil.which("java") is None:
        pytest.fail("Spark needs Java >= 17 on PATH, e.g. apt-get install openjdk-17-jre-headless")
    cache = Path(os.environ.get("TINCT_CACHE_DIR", Path.home() / ".cache" / "tinct"))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tinct-lineage")
        .config("spark.jars.packages", DELTA_SPARK)
        .config("spark.jars.ivy", str(cache / "ivy"))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        # Small tables: one partition for Delta's log replay and for shuffles (defaults: 50, 200).
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _ours(root: Path, table: str, *extra: str) -> list[tuple[Any, ...]]:
    """Rows of ``table`` as ``tinct lineage sql --format json`` prints them."""
    from tinct.cli import main

    cols = COLUMNS[table]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["lineage", "sql", "--root", str(root), "--format", "json", *extra,
                     f"SELECT {', '.join(cols)} FROM {table}"])  # fmt: skip
    assert code == 0
    return sorted(_row(r, cols) for r in json.loads(out.getvalue()))


def _theirs(spark: Any, root: Path, table: str, version: int | None = None) -> list[tuple[Any, ...]]:
    """Rows of ``table`` as Spark reads them through Delta's connector."""
    cols = COLUMNS[table]
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return sorted(_row(r.asDict(), cols) for r in reader.load(str(root / table)).select(*cols).collect())


def _row(r: dict[str, Any], cols: list[str]) -> tuple[Any, ...]:
    return tuple(json.dumps(r[c], sort_keys=True) if isinstance(r[c], dict) else r[c] for c in cols)


def test_spark_reads_the_operator_tables_as_tinct_lineage_sql_does(
    cluster: Cluster, namespace: str, tmp_path: Path, spark: Any
) -> None:
    root = tmp_path / "lineage"
    backends(cluster, namespace, tmp_path)
    with operator(namespace, root):
        apply(cluster, namespace, example(analysis=NO_METRICS))
        wait_release(cluster, namespace, lambda s: s.get("phase") == "Promoted", "Promoted")
        # The Delta version holding both versions of the release, whichever was recorded last.
        recorded = [
            get(cluster, namespace, "modelversion", n) for n in ("llama3-8b-1-4-0", "llama3-8b-2-0-0")
        ]
        then = max(mv["status"]["lineage"]["version"] for mv in recorded if mv)
        # A later version, recorded after `then`: time travel must not see it.
        apply(
            cluster,
            namespace,
            modelversion("llama3-8b-3-0-0", "3.0.0", make_onnx(tmp_path / "m3.onnx", dim=8)),
        )

        def ready() -> bool:
            mv = get(cluster, namespace, "modelversion", "llama3-8b-3-0-0") or {}
            return (mv.get("status") or {}).get("phase") == "Ready"

        eventually(ready, timeout=WAIT, what="the third version Ready")

    for table in COLUMNS:
        ours = _ours(root, table)
        assert ours, f"{table} is empty"
        assert _theirs(spark, root, table) == ours, table
    states = {(r[4], r[5]) for r in _ours(root, "release_events")}
    assert (4, "Promoted") in states  # steps count from 1: the Promoted row is 4 of 4

    past = _ours(root, "model_versions", "--as-of-version", str(then))
    assert _theirs(spark, root, "model_versions", version=then) == past
    assert {r[3] for r in past} == {"1.4.0", "1.5.0"}
    assert "3.0.0" in {r[3] for r in _ours(root, "model_versions")}
    sql = spark.sql(
        f"SELECT count(*) AS n FROM delta.`{root / 'model_versions'}` VERSION AS OF {then}"
    ).first()
    assert sql is not None
    assert sql["n"] == len(past)
