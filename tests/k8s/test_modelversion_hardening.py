"""Hostile and heavy ModelVersions on the real API server, real files and Delta tables.

- ``file://`` reads only inside ``--artifact-root`` directories, whatever the spelling;
- a small version does not wait behind a big one, and a delete or a new generation
  stops the hashing in progress;
- SIGTERM while hashing ends the process promptly, and a restart finishes the version;
- artifacts at the caps of tinct.artifacts.limits are read, ones over a cap fail once
  naming it, and an index naming 10,000 missing shards fails with a summarised message:
  each failure is one status write and one Event, never a retry loop.

Each test prints what it observed (seconds, bytes, messages).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from tinct.artifacts import limits
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.interface_artifacts import (
    big_index,
    big_safetensors_header,
    big_tokenizer,
    make_llm_shards,
    onnx_with_inputs,
    onnx_with_sparse_initializers,
)
from tinct_testing.lineage_artifacts import make_onnx, make_ptx, sha256_file
from tinct_testing.modelversion_cluster import (
    FileOpens,
    apply,
    big_safetensors,
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

GiB = 1024**3
MiB = 1024**2


def _bytes_read(pid: int) -> int:
    """Bytes process ``pid`` has read so far (``rchar``); 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("rchar:"))


def _progress(cluster: Cluster, ns: str, name: str) -> tuple[int, int]:
    st = (get(cluster, ns, name) or {}).get("status") or {}
    p = st.get("progress") or {}
    return int(p.get("bytesDone", 0)), int(p.get("bytesTotal", 0))


def test_file_uris_are_confined_to_the_artifact_roots(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    onnx = make_onnx(models / "m.onnx")
    ckpt = make_ptx(models / "inside.pt")
    (models / "shadow").symlink_to("/etc/shadow")
    (models / "up").symlink_to(tmp_path)
    (tmp_path / "secret.pt").write_bytes(b"not for the operator")
    hostile = {
        "passwd": "file:///etc/passwd",
        "environ": "file:///proc/self/environ",
        "absent": "file:///etc/no-such-file-here",
        "dotdot": f"{models.as_uri()}/../../../../etc/passwd",
        "encoded": f"{models.as_uri()}/%2e%2e/secret.pt",
        "symlink": (models / "shadow").as_uri(),
        "dirlink": f"{(models / 'up').as_uri()}/secret.pt",
        "host": f"file://files.example{onnx}",
    }
    root = tmp_path / "lineage"
    with operator(namespace, root, models):
        apply(
            cluster,
            namespace,
            mv_doc("inside", [{"format": "onnx", "uri": onnx.as_uri()}], source={"uri": ckpt.as_uri()}),
        )
        for name, uri in hostile.items():
            apply(
                cluster,
                namespace,
                mv_doc(name, [{"format": "onnx", "uri": onnx.as_uri()}], source={"uri": uri}),
            )
        ok = wait_phase(cluster, namespace, "inside", "Ready", "Failed")
        got = {name: wait_phase(cluster, namespace, name, "Ready", "Failed") for name in hostile}

    assert ok["status"]["phase"] == "Ready", ok["status"]
    assert ok["status"]["digests"]["source"] == sha256_file(ckpt)
    secrets = {
        hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest(),
        sha256_file(tmp_path / "secret.pt"),
    }
    for name, obj in got.items():
        st = obj["status"]
        print(f"{name}: {st['phase']}: {st['message']}")
        assert st["phase"] == "Failed", (name, st)
        c = cond(obj, "Verified")
        assert (c["status"], c["reason"]) == ("False", "ArtifactRefused"), (name, c)
        assert st["message"].startswith(f"spec.source.uri {hostile[name]}: "), st["message"]
        assert "digests" not in st
        assert "artifacts" not in st
        assert not secrets & set(json.dumps(st).split('"'))
    # The refusal of a file that exists reads exactly like that of one that does not.
    assert got["passwd"]["status"]["message"].replace(hostile["passwd"], "URI") == got["absent"]["status"][
        "message"
    ].replace(hostile["absent"], "URI")
    assert "names no host" in got["host"]["status"]["message"]
    recorded = rows(
        root, "SELECT name, event, reason, source_sha256 FROM model_versions WHERE name <> 'inside'"
    )
    assert sorted(r["name"] for r in recorded) == sorted(hostile)
    assert {(r["event"], r["reason"], r["source_sha256"]) for r in recorded} == {
        ("failed", "ArtifactRefused", None)
    }
    assert not secrets & {r["sha256"] for r in rows(root, "SELECT sha256 FROM artifacts")}


def test_without_an_artifact_root_file_uris_are_refused(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    onnx = make_onnx(tmp_path / "m.onnx")
    with operator(namespace, tmp_path / "lineage", None):
        apply(cluster, namespace, mv_doc("local", [{"format": "onnx", "uri": onnx.as_uri()}]))
        obj = wait_phase(cluster, namespace, "local", "Ready", "Failed")
    print(f"no root: {obj['status']['message']}")
    assert obj["status"]["phase"] == "Failed"
    assert cond(obj, "Verified")["reason"] == "ArtifactRefused"
    assert "--artifact-root DIR" in obj["status"]["message"]
    assert "TINCT_ARTIFACT_ROOTS" in obj["status"]["message"]


def _apply_big(cluster: Cluster, ns: str, name: str, shards: list[Path]) -> None:
    """Apply a version of ``shards`` and return once it is hashing."""
    apply(cluster, ns, mv_doc(name, [{"format": "safetensors", "uri": p.as_uri()} for p in shards]))
    eventually(lambda: hashing(cluster, ns, name), timeout=WAIT, what=f"{name} hashing")


def test_small_version_does_not_wait_and_a_new_generation_stops_hashing(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    shards = [big_safetensors(tmp_path / f"big-{i}.safetensors", 8 * GiB) for i in range(4)]
    small_onnx, small_ptx = make_onnx(tmp_path / "small.onnx"), make_ptx(tmp_path / "small.ptx")
    small = [{"format": "onnx", "uri": small_onnx.as_uri()}, {"format": "ptx", "uri": small_ptx.as_uri()}]
    root = tmp_path / "lineage"
    opens = FileOpens(*shards)
    try:
        with operator(namespace, root, tmp_path, TINCT_HASH_WORKERS="2"):
            _apply_big(cluster, namespace, "big", shards)
            start_done, total = _progress(cluster, namespace, "big")
            t0 = time.monotonic()
            apply(cluster, namespace, mv_doc("small", small))
            wait_phase(cluster, namespace, "small", "Ready")
            small_s = time.monotonic() - t0
            big_done, _ = _progress(cluster, namespace, "big")
            big_phase = (get(cluster, namespace, "big") or {})["status"]["phase"]

            t1 = time.monotonic()
            apply(cluster, namespace, mv_doc("big", small))
            obj = wait_phase(cluster, namespace, "big", "Ready")
            regen_s = time.monotonic() - t1
            eventually(
                lambda: opens.take() is not None and opens.open_now == 0, timeout=30, what="big shards closed"
            )
    finally:
        opens.close()
    print(
        f"small Ready {small_s:.2f}s after apply while big hashed {(big_done - start_done) / GiB:.2f} "
        f"of {total / GiB:.0f} GiB (big: {big_phase}); generation 2 of big Ready {regen_s:.2f}s after apply"
    )
    assert big_phase == "Hashing"
    # First come, first served would finish three of big's four shards first.
    assert big_done < total / 2
    assert obj["metadata"]["generation"] == 2
    recorded = rows(root, "SELECT name, generation, event FROM model_versions ORDER BY name")
    assert recorded == [
        {"name": "big", "generation": 2, "event": "registered"},
        {"name": "small", "generation": 1, "event": "registered"},
    ]


def test_delete_stops_hashing(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    shards = [big_safetensors(tmp_path / f"big-{i}.safetensors", 8 * GiB) for i in range(2)]
    root = tmp_path / "lineage"
    opens = FileOpens(*shards)
    try:
        with operator(namespace, root, tmp_path, TINCT_HASH_WORKERS="2"):
            _apply_big(cluster, namespace, "doomed", shards)
            t0 = time.monotonic()
            cluster.kubectl("delete", "modelversion", "doomed", "-n", namespace, "--wait=false")
            eventually(lambda: get(cluster, namespace, "doomed") is None, timeout=WAIT, what="deletion")
            gone_s = time.monotonic() - t0
            eventually(
                lambda: opens.take() is not None and opens.open_now == 0, timeout=30, what="shards closed"
            )
            closed_s = time.monotonic() - t0
    finally:
        opens.close()
    print(f"deleted while hashing: object gone after {gone_s:.2f}s, every shard closed after {closed_s:.2f}s")
    assert rows(root, "SELECT event, onnx_sha256, safetensors_sha256 FROM model_versions") == [
        {"event": "retired", "onnx_sha256": None, "safetensors_sha256": None}
    ]


def test_sigterm_while_hashing_exits_promptly_and_restart_finishes(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    onnx = make_onnx(tmp_path / "m.onnx")
    big = sparse_file(tmp_path / "step.pt", 4 * GiB)
    root = tmp_path / "lineage"
    env = {**os.environ, "TINCT_PROGRESS_INTERVAL": "0.2"}
    env.pop("TINCT_ARTIFACT_ROOTS", None)
    cmd = [
        sys.executable,
        "-m",
        "tinct.cli",
        "operator",
        "--namespace",
        namespace,
        "--lineage-root",
        str(root),
    ]
    proc = subprocess.Popen(
        [*cmd, "--hash-workers", "1", "--artifact-root", str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    read = 0
    try:
        apply(
            cluster,
            namespace,
            mv_doc("big", [{"format": "onnx", "uri": onnx.as_uri()}], source={"uri": big.as_uri()}),
        )
        eventually(lambda: hashing(cluster, namespace, "big"), timeout=WAIT, what="hashing")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)

        def gone() -> bool:  # what the process has read, until it is gone
            nonlocal read
            if proc.poll() is not None:
                return True
            read = max(read, _bytes_read(proc.pid))
            return False

        eventually(gone, timeout=WAIT, interval=0.05, what="the operator gone after SIGTERM")
        exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    size = big.stat().st_size
    print(
        f"SIGTERM while hashing: exited (code {proc.returncode}) after {exit_s:.2f}s, "
        f"having read {read / GiB:.2f} GiB of the {size / GiB:.0f} GiB checkpoint"
    )
    assert proc.returncode == 0
    # Hashing to the end before exiting would have read the whole checkpoint.
    assert read < 0.9 * size
    mid = get(cluster, namespace, "big")
    assert mid is not None
    assert mid["status"]["phase"] == "Hashing"

    with operator(namespace, root, tmp_path, TINCT_HASH_WORKERS="2"):
        obj = wait_phase(cluster, namespace, "big", "Ready", "Failed", timeout=300)
    assert obj["status"]["phase"] == "Ready", obj["status"]
    assert obj["status"]["digests"]["source"] == sha256_file(big)
    assert rows(root, "SELECT event FROM model_versions") == [{"event": "registered"}]
    assert len(rows(root, "SELECT uri FROM artifacts")) == 2


def _events(cluster: Cluster, ns: str, name: str) -> list[dict[str, object]]:
    out = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    ).stdout
    items: list[dict[str, object]] = json.loads(out)["items"]
    return items


def _sparse_safetensors(path: Path, header: int) -> Path:
    """A file that announces a ``header``-byte JSON header (sparse: nothing is written)."""
    with path.open("wb") as f:
        f.write(struct.pack("<Q", header) + b"{")
        f.truncate(8 + header + 1024)
    return path


def test_artifacts_at_the_caps_are_read_and_hostile_ones_fail_once(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "tok").mkdir()
    tokenizer = tmp_path / "tok" / "tokenizer.json"
    vocab_digest = big_tokenizer(tokenizer, limits.TOKENIZER_MAX_VOCAB - 2, limits.TOKENIZER_MAX_BYTES - MiB)
    shard = big_safetensors_header(
        tmp_path / "cap.safetensors", limits.SAFETENSORS_MAX_TENSORS, limits.SAFETENSORS_MAX_HEADER - MiB
    )
    weights = onnx_with_sparse_initializers(tmp_path / "weights.onnx", 2 * GiB)
    million = onnx_with_inputs(tmp_path / "million.onnx", 1_000_000)
    huge = _sparse_safetensors(tmp_path / "huge.safetensors", 97 * 1000 * 1000)
    (tmp_path / "sharded").mkdir()
    first = make_llm_shards(tmp_path / "sharded")[0]
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    missing = big_index(index, 10_000, 2 * MiB, shards=10_000)
    versions = {
        "tok-caps": [("tokenizer", tokenizer)],
        "st-caps": [("safetensors", shard)],
        "onnx-2gib": [("onnx", weights)],
        "onnx-1m": [("onnx", million)],
        "st-huge": [("safetensors", huge)],
        "index-10k": [("safetensors", first), ("safetensors", index)],
    }
    failing = {
        "onnx-1m": ("LimitExceeded", "(ONNX_MAX_ENTRIES)"),
        "st-huge": ("LimitExceeded", "(SAFETENSORS_MAX_HEADER)"),
        "index-10k": (
            "InterfaceInconsistent",
            f"10,000 shard(s) that no artifact declares: {missing[0]}, {missing[1]}, {missing[2]}, "
            "… and 9,997 more",
        ),
    }
    root = tmp_path / "lineage"
    opens = FileOpens(index)
    try:
        with operator(namespace, root, tmp_path) as runner:
            for name, files in versions.items():
                apply(cluster, namespace, mv_doc(name, [{"format": f, "uri": p.as_uri()} for f, p in files]))
            got = {
                name: wait_phase(cluster, namespace, name, "Ready", "Failed", timeout=900)
                for name in versions
            }
            events = {
                name: eventually(
                    lambda name=name: _events(cluster, namespace, name), timeout=WAIT, what=f"{name} event"
                )
                for name in versions
            }
            index_opens = opens.take()[index.name]
    finally:
        opens.close()
    for name, obj in got.items():
        st = obj["status"]
        print(f"{name}: {st['phase']}: {st['message'][:300]}")
        if name not in failing:
            assert st["phase"] == "Ready", (name, st)
            continue
        reason, text = failing[name]
        assert st["phase"] == "Failed", (name, st)
        c = cond(obj, "Verified")
        assert (c["status"], c["reason"]) == ("False", reason), (name, c)
        assert text in st["message"], (name, st["message"])
        assert len(st["message"]) < 2048
        assert [e["reason"] for e in events[name]] == [reason], (name, events[name])
        assert [e.get("count", 1) for e in events[name]] == [1]
    # Failed once: the handler finished (no exception, no retry), the index was read once.
    assert "Will retry" not in runner.output
    assert index_opens == 1
    assert "vocab 2097152" in got["tok-caps"]["status"]["interface"]["summary"]
    recorded = {
        r["name"]: r
        for r in rows(
            root, "SELECT name, format, vocab_size, vocab_digest, tensor_count, facts FROM interfaces"
        )
    }
    assert (recorded["tok-caps"]["vocab_size"], recorded["tok-caps"]["vocab_digest"]) == (
        limits.TOKENIZER_MAX_VOCAB,
        vocab_digest,
    )
    assert recorded["st-caps"]["tensor_count"] == limits.SAFETENSORS_MAX_TENSORS
    assert json.loads(recorded["onnx-2gib"]["facts"])["inputs"] == {
        "bias": {"dtype": "FLOAT", "shape": [1], "optional": True},
        "x": {"dtype": "FLOAT", "shape": [1], "optional": False},
    }
    failed = rows(root, "SELECT name, event, reason FROM model_versions WHERE event = 'failed' ORDER BY name")
    assert failed == [{"name": n, "event": "failed", "reason": failing[n][0]} for n in sorted(failing)]
