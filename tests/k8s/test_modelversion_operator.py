"""The ModelVersion operator on the real API server, with real artifacts and lineage tables.

Artifacts are small files made by the onnx and safetensors packages, on local disk and in
an S3-compatible server (moto) started by the tests. The operator runs in-process through
``KopfRunner``, or as a ``tinct operator`` subprocess where a test kills it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner

from controlplane.environ import patched_environ
from controlplane.harness import Cluster
from lineage_artifacts import S3, make_artifact_set, make_onnx, s3, s3_server, sha256_file
from tinct.artifacts.hashing import manifest_digest
from tinct.lineage.sql import query

__all__ = ["s3", "s3_server"]

pytestmark = pytest.mark.usefixtures("crds")

WAIT = 120.0


def _mv(name: str, artifacts: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {"model": spec.pop("model", "llama3-8b"), "version": "1.0.0", "artifacts": artifacts, **spec},
    }


def _apply(cluster: Cluster, ns: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))


def _get(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "modelversion", name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


def _wait(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


def _wait_phase(cluster: Cluster, ns: str, name: str, *phases: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = _get(cluster, ns, name)
        st = (obj or {}).get("status") or {}
        gen = (obj or {}).get("metadata", {}).get("generation")
        if st.get("phase") in phases and st.get("observedGeneration") == gen:
            return obj
        return None

    obj: dict[str, Any] = _wait(f"{name} in {phases}", check)
    return obj


def _cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


@contextmanager
def _operator(ns: str, root: Path, **env: str) -> Iterator[KopfRunner]:
    with patched_environ(TINCT_LINEAGE_ROOT=str(root), TINCT_PROGRESS_INTERVAL="0.3", **env):
        args = ["run", "-m", "tinct.operator.modelversion", "--standalone", "--namespace", ns]
        with KopfRunner(args, timeout=60) as runner:
            yield runner
        assert runner.exception is None, runner.output
        assert runner.exit_code == 0, runner.output


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = query(sql, str(root)).to_pylist()
    return rows


def test_local_and_s3_artifacts_become_ready_and_queryable(
    cluster: Cluster, namespace: str, tmp_path: Path, s3: S3
) -> None:
    files = make_artifact_set(tmp_path / "art")
    s3.bucket("models")
    shard_uris = [s3.put("models", f"llama/{p.name}", p) for p in files.shards]
    ptx_uri = s3.put("models", "llama/kernels.ptx", files.ptx)
    doc = _mv(
        "llama-1-0-0",
        [
            {"format": "onnx", "uri": files.onnx.as_uri(), "sha256": sha256_file(files.onnx)},
            {"format": "ptx", "uri": ptx_uri},
            *[{"format": "safetensors", "uri": u} for u in shard_uris],
        ],
        source={"uri": files.source.as_uri()},
        buildPipelineId="ci-1",
        quantization={"method": "awq", "bits": 4, "symmetric": True, "groupSize": 128},
        runtime="vllm",
    )
    root = tmp_path / "lineage"
    with _operator(namespace, root):
        _apply(cluster, namespace, doc)
        obj = _wait_phase(cluster, namespace, "llama-1-0-0", "Ready")

    st = obj["status"]
    assert st["digests"] == {
        "onnx": sha256_file(files.onnx),
        "ptx": sha256_file(files.ptx),
        "safetensors": manifest_digest(sha256_file(p) for p in files.shards),
        "source": sha256_file(files.source),
    }
    by_uri = {a["uri"]: a for a in st["artifacts"]}
    assert by_uri[shard_uris[1]]["sha256"] == sha256_file(files.shards[1])
    assert by_uri[shard_uris[1]]["size"] == files.shards[1].stat().st_size
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "Compatible": "True",
        "Verified": "True",
        "Recorded": "True",
    }
    assert st["lineage"]["table"] == f"{root}/model_versions"
    assert "tinct.io/last-handled-configuration" in obj["metadata"]["annotations"]

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tinct.cli",
            "lineage",
            "sql",
            "SELECT m.event, m.safetensors_sha256, count(*) AS files FROM model_versions m "
            "JOIN artifacts a ON a.event_id = m.event_id GROUP BY m.event, m.safetensors_sha256",
            "--root",
            str(root),
            "--format",
            "json",
            "--as-of-version",
            str(st["lineage"]["version"]),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == [
        {"event": "registered", "safetensors_sha256": st["digests"]["safetensors"], "files": 5}
    ]


def test_bad_inputs_fail_with_actionable_reasons(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    good = make_onnx(tmp_path / "good.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(good.read_bytes()[:-20])
    cases = {
        "missing": (
            _mv("missing", [{"format": "onnx", "uri": (tmp_path / "absent.onnx").as_uri()}]),
            "Verified",
            "ArtifactMissing",
        ),
        "mismatch": (
            _mv("mismatch", [{"format": "onnx", "uri": good.as_uri(), "sha256": "0" * 64}]),
            "Verified",
            "DigestMismatch",
        ),
        "corrupt": (
            _mv("corrupt", [{"format": "onnx", "uri": corrupt.as_uri()}]),
            "Verified",
            "InvalidFormat",
        ),
        "incompatible": (
            _mv(
                "incompatible",
                [{"format": "onnx", "uri": good.as_uri()}],
                quantization={"method": "awq", "bits": 4, "symmetric": False, "groupSize": 128},
                runtime="tensorrt-llm",
            ),
            "Compatible",
            "AsymmetricAWQUnsupported",
        ),
    }
    root = tmp_path / "lineage"
    with _operator(namespace, root):
        for doc, _, _ in cases.values():
            _apply(cluster, namespace, doc)
        results = {name: _wait_phase(cluster, namespace, name, "Failed", "Ready") for name in cases}
        events = _wait(
            "warning events",
            lambda: (
                json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout).get(
                    "items"
                )
                or None
            ),
        )
    for name, (_, cond_type, reason) in cases.items():
        st = results[name]["status"]
        assert st["phase"] == "Failed", (name, st)
        cond = _cond(results[name], cond_type)
        assert (cond["status"], cond["reason"]) == ("False", reason), (name, cond)
        assert st["message"]
    assert "spec.artifacts[0].sha256" in results["mismatch"]["status"]["message"]
    assert "upload it or fix spec.artifacts[0].uri" in results["missing"]["status"]["message"]
    assert any(e.get("reason") == "DigestMismatch" for e in events)
    rows = _rows(root, "SELECT name, event, reason FROM model_versions ORDER BY name")
    assert rows == sorted(
        ({"name": n, "event": "failed", "reason": r} for n, (_, _, r) in cases.items()),
        key=lambda r: r["name"],
    )


def test_spec_change_rehashes_resync_does_not_and_delete_retires(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    a = make_onnx(tmp_path / "a.onnx", dim=4)
    b = make_onnx(tmp_path / "b.onnx", dim=8)
    root = tmp_path / "lineage"
    with _operator(namespace, root):
        _apply(cluster, namespace, _mv("m", [{"format": "onnx", "uri": a.as_uri()}]))
        first = _wait_phase(cluster, namespace, "m", "Ready")
        _apply(cluster, namespace, _mv("m", [{"format": "onnx", "uri": b.as_uri()}]))
        second = _wait_phase(cluster, namespace, "m", "Ready")
    assert first["status"]["digests"]["onnx"] == sha256_file(a)
    assert second["status"]["digests"]["onnx"] == sha256_file(b)
    assert second["status"]["lineage"]["version"] > first["status"]["lineage"]["version"]

    # A restart resumes the object; the generation is already handled: no new row.
    with _operator(namespace, root):
        _apply(cluster, namespace, {**_mv("m", [{"format": "onnx", "uri": b.as_uri()}])})
        time.sleep(2)
        cluster.kubectl("delete", "modelversion", "m", "-n", namespace, "--wait=false")
        _wait("deletion", lambda: _get(cluster, namespace, "m") is None)

    rows = _rows(root, "SELECT generation, event, onnx_sha256 FROM model_versions ORDER BY generation, event")
    assert [(r["generation"], r["event"]) for r in rows[:2]] == [(1, "registered"), (2, "updated")]
    assert rows[2]["event"] == "retired"
    assert rows[2]["onnx_sha256"] == sha256_file(b)
    assert len(rows) == 3


def test_operator_killed_while_hashing_ends_ready_with_one_row(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    onnx = make_onnx(tmp_path / "m.onnx")
    big = tmp_path / "step.pt"
    with big.open("wb") as f:  # sparse: costs no disk, still read and hashed byte by byte
        f.truncate(6 * 1024**3)
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    root = tmp_path / "lineage"
    env = {
        **os.environ,
        "TINCT_LINEAGE_ROOT": str(root),
        "TINCT_PROGRESS_INTERVAL": "0.2",
        "TINCT_HASH_WORKERS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinct.cli", "operator", "--namespace", namespace],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _apply(
            cluster,
            namespace,
            _mv("big", [{"format": "onnx", "uri": onnx.as_uri()}], source={"uri": big.as_uri()}),
        )

        def hashing() -> bool:
            st = (_get(cluster, namespace, "big") or {}).get("status") or {}
            return st.get("phase") == "Hashing" and st.get("progress", {}).get("bytesDone", 0) > 0

        _wait("progress while hashing", hashing)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    mid = _get(cluster, namespace, "big")
    assert mid is not None
    assert mid["status"]["phase"] == "Hashing"
    assert mid["status"]["progress"]["bytesTotal"] == big.stat().st_size + onnx.stat().st_size

    with _operator(namespace, root, TINCT_HASH_WORKERS="2"):
        obj = _wait_phase(cluster, namespace, "big", "Ready", "Failed")
    assert obj["status"]["phase"] == "Ready", obj["status"]
    assert obj["status"]["digests"]["source"] == sha256_file(big)
    assert "progress" not in obj["status"]
    assert _rows(root, "SELECT event FROM model_versions") == [{"event": "registered"}]
    assert len(_rows(root, "SELECT uri FROM artifacts")) == 2


def test_unreachable_store_retries_then_becomes_ready(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    import boto3

    from controlplane.harness import free_port
    from lineage_artifacts import make_ptx, moto_process

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    root = tmp_path / "lineage"
    ptx = make_ptx(tmp_path / "k.ptx")
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    with _operator(namespace, root, TINCT_S3_ENDPOINT=endpoint, **creds):
        _apply(cluster, namespace, _mv("later", [{"format": "ptx", "uri": "s3://late/k.ptx"}]))

        def retrying() -> dict[str, Any] | None:
            obj = _get(cluster, namespace, "later")
            conds = ((obj or {}).get("status") or {}).get("conditions") or []
            hit = any(c["type"] == "Verified" and c["reason"] == "StorageUnavailable" for c in conds)
            return obj if hit else None

        waiting = _wait("Verified=Unknown/StorageUnavailable", retrying)
        assert waiting["status"]["phase"] != "Failed", waiting["status"]
        assert _cond(waiting, "Verified")["status"] == "Unknown"
        assert "retrying in" in waiting["status"]["message"]
        with moto_process(port):
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                region_name="us-east-1",
            )
            client.create_bucket(Bucket="late")
            client.upload_file(str(ptx), "late", "k.ptx")
            obj = _wait_phase(cluster, namespace, "later", "Ready", "Failed")
    assert obj["status"]["phase"] == "Ready", obj["status"]
    assert obj["status"]["digests"]["ptx"] == sha256_file(ptx)
