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
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from tinct.artifacts.hashing import manifest_digest
from tinct.artifacts.storage import StorageConfig
from tinct.lineage.sql import query
from tinct_testing.controlplane.environ import patched_environ
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.lineage_artifacts import S3, make_artifact_set, make_onnx, sha256_file, unconditional_store
from tinct_testing.lora_artifacts import adapter_artifacts, make_adapter, make_base
from tinct_testing.modelversion_cluster import (
    FileOpens,
    apply,
    cond,
    get,
    hashing,
    mv_doc,
    operator,
    rows,
    sparse_file,
    wait_phase,
)
from tinct_testing.wait import WAIT, eventually


def test_local_and_s3_artifacts_become_ready_and_queryable(
    cluster: Cluster, namespace: str, tmp_path: Path, s3: S3
) -> None:
    files = make_artifact_set(tmp_path / "art")
    s3.bucket("models")
    shard_uris = [s3.put("models", f"llama/{p.name}", p) for p in files.shards]
    ptx_uri = s3.put("models", "llama/kernels.ptx", files.ptx)
    doc = mv_doc(
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
    with operator(namespace, root, tmp_path):
        apply(cluster, namespace, doc)
        # What a script waits for: the Ready condition, as for any Kubernetes object.
        cluster.kubectl(
            "wait", "mv/llama-1-0-0", "-n", namespace, "--for=condition=Ready", f"--timeout={WAIT:.0f}s"
        )
        obj = get(cluster, namespace, "llama-1-0-0")
    assert obj is not None

    st = obj["status"]
    assert st["phase"] == "Ready"
    ready = cond(obj, "Ready")
    assert (ready["reason"], ready["message"], ready["observedGeneration"]) == (
        "VerifiedAndRecorded",
        st["message"],
        1,
    )
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
        "InterfaceCompatible": "True",
        "Ready": "True",
    }
    # The first version of its model: nothing to hold its number to yet.
    assert {c["type"]: c["reason"] for c in st["conditions"]}["InterfaceCompatible"] == "NoEarlierVersion"
    assert st["interface"]["digest"]
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
            mv_doc("missing", [{"format": "onnx", "uri": (tmp_path / "absent.onnx").as_uri()}]),
            "Verified",
            "ArtifactMissing",
        ),
        "mismatch": (
            mv_doc("mismatch", [{"format": "onnx", "uri": good.as_uri(), "sha256": "0" * 64}]),
            "Verified",
            "DigestMismatch",
        ),
        "corrupt": (
            mv_doc("corrupt", [{"format": "onnx", "uri": corrupt.as_uri()}]),
            "Verified",
            "InvalidFormat",
        ),
        "incompatible": (
            mv_doc(
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
    with operator(namespace, root, tmp_path):
        for doc, _, _ in cases.values():
            apply(cluster, namespace, doc)
        results = {name: wait_phase(cluster, namespace, name, "Failed", "Ready") for name in cases}
        events = eventually(
            lambda: (
                json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout).get(
                    "items"
                )
                or None
            ),
            timeout=WAIT,
            what="warning events",
        )
    for name, (_, cond_type, reason) in cases.items():
        st = results[name]["status"]
        assert st["phase"] == "Failed", (name, st)
        c = cond(results[name], cond_type)
        assert (c["status"], c["reason"]) == ("False", reason), (name, c)
        assert st["message"]
        # Ready says what holds the version: the reason of the condition that failed.
        ready = cond(results[name], "Ready")
        assert (ready["status"], ready["reason"], ready["message"]) == ("False", reason, c["message"])
    assert "spec.artifacts[0].sha256" in results["mismatch"]["status"]["message"]
    assert "upload it or fix spec.artifacts[0].uri" in results["missing"]["status"]["message"]
    assert any(e.get("reason") == "DigestMismatch" for e in events)
    recorded = rows(root, "SELECT name, event, reason FROM model_versions ORDER BY name")
    assert recorded == sorted(
        ({"name": n, "event": "failed", "reason": r} for n, (_, _, r) in cases.items()),
        key=lambda r: r["name"],
    )


def test_spec_change_rehashes_resync_does_not_and_delete_retires(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    a = make_onnx(tmp_path / "a.onnx", dim=4)
    b = make_onnx(tmp_path / "b.onnx", dim=8)
    root = tmp_path / "lineage"
    with operator(namespace, root, tmp_path):
        apply(cluster, namespace, mv_doc("m", [{"format": "onnx", "uri": a.as_uri()}]))
        first = wait_phase(cluster, namespace, "m", "Ready")
        apply(cluster, namespace, mv_doc("m", [{"format": "onnx", "uri": b.as_uri()}]))
        second = wait_phase(cluster, namespace, "m", "Ready")
    assert first["status"]["digests"]["onnx"] == sha256_file(a)
    assert second["status"]["digests"]["onnx"] == sha256_file(b)
    assert second["status"]["lineage"]["version"] > first["status"]["lineage"]["version"]
    assert cond(second, "Ready")["status"] == "True"
    assert cond(second, "Ready")["observedGeneration"] == 2

    # A restart resumes the object. Its generation is already handled, so none of its files
    # is read again (opens counted by the kernel, whoever opens them) and no row is added.
    # kopf lists, and so resumes, existing objects before it sees new ones: once a version
    # applied after the restart is Ready, the resume of "m" has run.
    c = make_onnx(tmp_path / "c.onnx", dim=2)
    opens = FileOpens(a, b)
    try:
        with operator(namespace, root, tmp_path):
            apply(cluster, namespace, mv_doc("later", [{"format": "onnx", "uri": c.as_uri()}]))
            wait_phase(cluster, namespace, "later", "Ready")
            reread = opens.take()
            cluster.kubectl("delete", "modelversion", "m", "-n", namespace, "--wait=false")
            eventually(lambda: get(cluster, namespace, "m") is None, timeout=WAIT, what="deletion")
    finally:
        opens.close()
    print(f"opens of m's files by the restarted operator: {reread}")
    assert reread == {"a.onnx": 0, "b.onnx": 0}

    recorded = rows(
        root,
        "SELECT generation, event, onnx_sha256 FROM model_versions WHERE name = 'm' ORDER BY generation, event",
    )
    assert [(r["generation"], r["event"]) for r in recorded[:2]] == [(1, "registered"), (2, "updated")]
    assert recorded[2]["event"] == "retired"
    assert recorded[2]["onnx_sha256"] == sha256_file(b)
    assert len(recorded) == 3


def test_operator_killed_while_hashing_ends_ready_with_one_row(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    onnx = make_onnx(tmp_path / "m.onnx")
    big = sparse_file(tmp_path / "step.pt", 6 * 1024**3)
    root = tmp_path / "lineage"
    env = {
        **os.environ,
        "TINCT_LINEAGE_ROOT": str(root),
        "TINCT_PROGRESS_INTERVAL": "0.2",
        "TINCT_HASH_WORKERS": "1",
        "TINCT_ARTIFACT_ROOTS": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinct.cli", "operator", "--namespace", namespace],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        apply(
            cluster,
            namespace,
            mv_doc("big", [{"format": "onnx", "uri": onnx.as_uri()}], source={"uri": big.as_uri()}),
        )
        eventually(lambda: hashing(cluster, namespace, "big"), timeout=WAIT, what="progress while hashing")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    mid = get(cluster, namespace, "big")
    assert mid is not None
    assert mid["status"]["phase"] == "Hashing"
    assert mid["status"]["progress"]["bytesTotal"] == big.stat().st_size + onnx.stat().st_size

    with operator(namespace, root, tmp_path, TINCT_HASH_WORKERS="2"):
        obj = wait_phase(cluster, namespace, "big", "Ready", "Failed")
    assert obj["status"]["phase"] == "Ready", obj["status"]
    assert obj["status"]["digests"]["source"] == sha256_file(big)
    assert "progress" not in obj["status"]
    assert rows(root, "SELECT event FROM model_versions") == [{"event": "registered"}]
    assert len(rows(root, "SELECT uri FROM artifacts")) == 2


def test_unreachable_store_retries_then_becomes_ready(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    from tinct_testing.controlplane.harness import free_port
    from tinct_testing.lineage_artifacts import make_ptx, store_comes_up

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    root = tmp_path / "lineage"
    ptx = make_ptx(tmp_path / "k.ptx")
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    with operator(namespace, root, None, TINCT_S3_ENDPOINT=endpoint, **creds):
        apply(cluster, namespace, mv_doc("later", [{"format": "ptx", "uri": "s3://late/k.ptx"}]))

        def retrying() -> dict[str, Any] | None:
            obj = get(cluster, namespace, "later")
            conds = ((obj or {}).get("status") or {}).get("conditions") or []
            hit = any(c["type"] == "Verified" and c["reason"] == "StorageUnavailable" for c in conds)
            return obj if hit else None

        waiting = eventually(retrying, timeout=WAIT, what="Verified=Unknown/StorageUnavailable")
        assert waiting["status"]["phase"] != "Failed", waiting["status"]
        assert cond(waiting, "Verified")["status"] == "Unknown"
        assert "retrying in" in waiting["status"]["message"]
        # The store comes up elsewhere, is filled, and only then becomes reachable at the
        # endpoint the operator retries: a retry must never see an empty store.
        with store_comes_up(port, "late", {"k.ptx": ptx}):
            obj = wait_phase(cluster, namespace, "later", "Ready", "Failed")
    assert obj["status"]["phase"] == "Ready", obj["status"]
    assert obj["status"]["digests"]["ptx"] == sha256_file(ptx)


def _tinct_operator(
    namespace: str, root: str, artifacts: Path, log: Path, *flags: str, **env: str
) -> subprocess.Popen[bytes]:
    """``tinct operator`` as the chart runs it, its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tinct.cli",
                "operator",
                "--namespace",
                namespace,
                "--lineage-root",
                root,
                "--artifact-root",
                str(artifacts),
                *flags,
            ],
            env={**os.environ, "TINCT_PROGRESS_INTERVAL": "0.3", **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def test_lineage_on_a_store_without_conditional_writes_is_refused_unless_single_writer(
    cluster: Cluster, namespace: str, tmp_path: Path, s3: S3, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = s3.bucket(f"unconditional-{namespace}"[:63])
    onnx = make_onnx(tmp_path / "m.onnx")
    root = f"s3://{bucket}/unconditional"
    with unconditional_store(s3.endpoint) as endpoint:
        refused = subprocess.run(
            [sys.executable, "-m", "tinct.cli", "operator", "--namespace", namespace, "--lineage-root", root],
            env={**os.environ, "TINCT_S3_ENDPOINT": endpoint},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines()[-1] == (
            f"tinct operator: the store under {root} does not refuse a second commit of the same table "
            "version (it ignores conditional writes, If-None-Match), so two operator replicas, or a paused "
            "leader and the standby that took over, could erase each other's lineage commits; use a store "
            "with conditional writes (AWS S3 and current S3-compatible stores have them), or run a single "
            "operator replica with --lineage-single-writer (TINCT_LINEAGE_SINGLE_WRITER=true, chart value "
            "operator.lineage.singleWriter)"
        )
        listed = s3.client.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert listed == [], "the check leaves nothing behind"
        # Run as kopf run -m tinct.operator.modelversion, its startup refuses the same way.
        args = ["run", "-m", "tinct.operator.modelversion", "--standalone", "-n", namespace]
        with (
            patched_environ(TINCT_LINEAGE_ROOT=root, TINCT_S3_ENDPOINT=endpoint),
            KopfRunner(args, reraise=False) as kopf,
        ):
            eventually(
                lambda: any("does not refuse a second commit" in r.getMessage() for r in caplog.records),
                timeout=WAIT,
                what="the startup to fail",
            )
        assert kopf.exception is not None, "the operator stopped on the failed startup"
        assert "does not refuse a second commit" in str(kopf.exception.__cause__)

        # Said to be the only writer, the operator takes the store as it is.
        log = tmp_path / "operator.log"
        proc = _tinct_operator(
            namespace, root, tmp_path, log, "--lineage-single-writer", TINCT_S3_ENDPOINT=endpoint
        )
        try:
            apply(cluster, namespace, mv_doc("single", [{"format": "onnx", "uri": onnx.as_uri()}]))
            obj = wait_phase(cluster, namespace, "single", "Ready", "Failed")
        finally:
            _stop(proc)
    assert obj["status"]["phase"] == "Ready", (obj["status"], log.read_text())
    assert f"single writer: the store under {root} is not checked" in log.read_text()
    recorded = query("SELECT name, event FROM model_versions", root, config=StorageConfig(s3.endpoint))
    assert recorded.to_pylist() == [{"name": "single", "event": "registered"}]


def test_two_operators_share_lineage_on_s3_and_lose_nothing(
    cluster: Cluster, namespace: str, tmp_path: Path, s3: S3
) -> None:
    """Two operator processes (watching a namespace each) record into one set of tables."""
    s3.bucket("shared")
    root = "s3://shared/lineage"
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other)
    names = [f"m-{i}" for i in range(5)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = [
            _tinct_operator(ns, root, tmp_path, tmp_path / f"operator-{ns}.log") for ns in (namespace, other)
        ]
        for ns in (namespace, other):
            for i, name in enumerate(names):
                onnx = make_onnx(tmp_path / f"{ns}-{name}.onnx", dim=2 + i)
                apply(cluster, ns, mv_doc(name, [{"format": "onnx", "uri": onnx.as_uri()}]))
        done = {
            (ns, n): wait_phase(cluster, ns, n, "Ready", "Failed") for ns in (namespace, other) for n in names
        }
    finally:
        for proc in procs:
            _stop(proc)
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("operator-*.log"))
    assert all(o["status"]["phase"] == "Ready" for o in done.values()), logs
    recorded = query(
        "SELECT namespace, name, event, count(*) AS n FROM model_versions GROUP BY namespace, name, event",
        root,
    ).to_pylist()
    assert sorted((r["namespace"], r["name"], r["event"], r["n"]) for r in recorded) == sorted(
        (ns, n, "registered", 1) for ns in (namespace, other) for n in names
    )
    files = query("SELECT count(*) AS n, count(DISTINCT event_id) AS e FROM artifacts", root).to_pylist()
    assert files == [{"n": 10, "e": 10}]
    # Each status names a commit that holds its event.
    versions = [o["status"]["lineage"]["version"] for o in done.values()]
    for (ns, name), obj in done.items():
        at = obj["status"]["lineage"]["version"]
        seen = query(
            f"SELECT count(*) AS n FROM model_versions WHERE namespace = '{ns}' AND name = '{name}'",
            root,
            as_of_version=at,
        )
        assert seen.column("n")[0].as_py() == 1, (ns, name, at)
    print(f"lineage versions of the ten events: {sorted(versions)}")


def test_an_adapter_waits_for_its_base_then_fits_it_or_fails_naming_the_module(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    base_file = make_base(tmp_path / "base" / "model.safetensors")
    adapters = {
        "support-1-0-0": make_adapter(tmp_path / "support", r=8),
        "narrow-1-0-0": make_adapter(tmp_path / "narrow", r=8, kv=4, seed=2),
        "wide-1-0-0": make_adapter(tmp_path / "wide", r=32, seed=3),
    }

    def adapter(name: str) -> dict[str, Any]:
        return mv_doc(
            name, adapter_artifacts(adapters[name]), model="support", adapter={"baseModelVersion": "base"}
        )

    root = tmp_path / "lineage"
    with operator(namespace, root, tmp_path):
        apply(cluster, namespace, adapter("support-1-0-0"))
        waiting = eventually(
            lambda: (
                (o := get(cluster, namespace, "support-1-0-0"))
                and any(
                    c.get("reason") == "BaseMissing" for c in (o.get("status") or {}).get("conditions", [])
                )
                and o
            ),
            timeout=WAIT,
            what="the adapter to wait for its base",
        )
        assert cond(waiting, "BaseCompatible")["status"] == "Unknown"
        assert waiting["status"].get("phase", "Pending") == "Pending"
        base = mv_doc("base", [{"format": "safetensors", "uri": base_file.as_uri()}], runtime="vllm")
        apply(cluster, namespace, base)
        ready = wait_phase(cluster, namespace, "support-1-0-0", "Ready", "Failed")
        for name in ("narrow-1-0-0", "wide-1-0-0"):
            apply(cluster, namespace, adapter(name))
        failed = {
            n: wait_phase(cluster, namespace, n, "Ready", "Failed") for n in ("narrow-1-0-0", "wide-1-0-0")
        }

    st = ready["status"]
    assert st["phase"] == "Ready", st
    assert cond(ready, "BaseCompatible")["reason"] == "AdapterFitsBase"
    assert st["adapter"] == {
        "baseModelVersion": "base",
        "baseModel": "llama3-8b",
        "servedName": "support-" + st["digests"]["lora"][:12],
        "path": adapters["support-1-0-0"].as_uri(),
        "rank": 8,
        "modules": 4,
    }
    narrow = failed["narrow-1-0-0"]
    assert narrow["status"]["phase"] == "Failed"
    assert cond(narrow, "BaseCompatible")["reason"] == "ShapeMismatch"
    assert narrow["status"]["message"] == (
        "module model.layers.0.self_attn.v_proj: the adapter's lora_A is [8, 16] and lora_B is [4, 8], "
        "which fit a base weight of [4, 16], but base ModelVersion base has "
        "model.layers.0.self_attn.v_proj.weight F16[8,16]"
    )
    assert cond(narrow, "Verified")["status"] == "True", "its files are fine: it does not fit its base"
    assert cond(failed["wide-1-0-0"], "BaseCompatible")["reason"] == "RankTooLarge"
    assert "r=32 is over maxLoraRank 16" in failed["wide-1-0-0"]["status"]["message"]
    got = rows(
        root,
        "SELECT name, event, base_model_version, base_model, lora_rank, lora_hash, served_name FROM model_lineage "
        "WHERE base_model_version IS NOT NULL ORDER BY name",
    )
    assert [
        (r["name"], r["event"], r["base_model_version"], r["base_model"], r["lora_rank"]) for r in got
    ] == [
        ("narrow-1-0-0", "failed", "base", "llama3-8b", 8),
        ("support-1-0-0", "registered", "base", "llama3-8b", 8),
        ("wide-1-0-0", "failed", "base", "llama3-8b", 32),
    ]
    assert (got[1]["lora_hash"], got[1]["served_name"]) == (
        st["digests"]["lora"],
        st["adapter"]["servedName"],
    )
    assert all(r["served_name"] == "support-" + r["lora_hash"][:12] for r in got)
