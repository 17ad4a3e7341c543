"""Lineage benchmark: hashing, Delta writes/queries, and 1,000 ModelVersions to Ready.

Prints one line per figure as it is measured, then the whole result as JSON on the last
line. Everything lives in a temporary directory that is removed at the end.

    python bench/lineage.py [--skip-cluster] [--hash-gib 1] [--rss-gib 4] [--versions 1000]

- hash_mb_s / openssl_mb_s / hash_ratio: one file of exactly ``--hash-gib`` GiB of random
  bytes (page cache warm), ours (``tinct.artifacts.hashing.hash_uri``) vs ``openssl dgst
  -sha256``, best of 3 each. Sizes under 64 MiB are refused: they time process start-up.
- parallel_speedup: time for 1 file / time for 2 equal files hashed at once, times 2.
- hash_peak_rss_mb: peak RSS growth of a child process hashing a sparse ``--rss-gib`` file.
- record_p50_ms: one event through the BatchWriter (MERGE of model_versions and
  artifacts) on local disk, 200 events in sequence, maintenance as the operator runs it.
- query_1m_rows_ms: ``tinct.lineage.history(model)`` over 1,000,000 compacted
  model_versions rows filled as the operator fills them (four distinct digests, source
  URI, pipeline id, quantization, runtime), median of 5 (includes opening the tables);
  query_1m_rows_table_bytes: that table's data files on disk.
- artifacts_query_ms / artifacts_table_bytes: the files of one model (SELECT over the
  artifacts table joined to model_versions) with 5 files per version (ONNX, PTX, two
  safetensors shards, the source checkpoint: 5,000,000 rows), median of 5; its bytes.
- files_after_10k_events: 10,000 one-event submissions from 16 threads (as concurrent
  reconciles do), the writer's own maintenance running as in the operator, then one
  more maintenance; active data files of model_versions.
- apply_1000_same_two_files_to_ready_s: the control plane of tinct_testing.controlplane,
  ``tinct operator`` as a subprocess, ``--versions`` ModelVersions that all name the same
  two tiny files, applied in one kubectl call, time until all are Ready: the operator's
  per-object overhead (reconcile, status, lineage rows), not hashing.
- apply_1000_distinct_artifacts_to_ready_s: the same with five distinct small files per
  version (ONNX, PTX, two safetensors shards, a 64 KiB checkpoint; 5,000 files in all),
  each hashed and validated.
- operator_rss_mb: peak RSS (VmHWM) of the operator over both runs. Duplicate lineage
  rows are checked after each run (the figure is null if any, or if not all were Ready).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinct_testing.paths import ROOT
from tinct_testing.wait import eventually

MIB = 1024 * 1024
GIB = 1024 * MIB
#: Below this, a timed hash is dominated by process and file start-up, not by hashing.
MIN_HASH_BYTES = 64 * MIB


def _say(name: str, value: Any) -> None:
    print(f"{name}: {value}", file=sys.stderr, flush=True)


def _random_file(path: Path, size: int) -> Path:
    """A file of exactly ``size`` random bytes."""
    with path.open("wb") as f:
        left = size
        while left:
            chunk = min(left, 16 * MIB)
            f.write(os.urandom(chunk))
            left -= chunk
    if path.stat().st_size != size:
        raise RuntimeError(f"{path}: wrote {path.stat().st_size} bytes, wanted {size}")
    return path


def _sparse_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _best(fn: Any, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_hashing(tmp: Path, gib: float, rss_gib: float) -> dict[str, Any]:
    from tinct.artifacts.hashing import hash_uri

    size = round(gib * GIB)
    a = _random_file(tmp / "a.bin", size)
    subprocess.run(["cat", str(a)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    openssl_s = _best(
        lambda: subprocess.run(["openssl", "dgst", "-sha256", str(a)], capture_output=True, check=True)
    )
    ours_s = _best(lambda: hash_uri(a.as_uri()))
    out: dict[str, Any] = {
        "hash_mb_s": round(size / MIB / ours_s, 1),
        "openssl_mb_s": round(size / MIB / openssl_s, 1),
    }
    out["hash_ratio"] = round(out["hash_mb_s"] / out["openssl_mb_s"], 3)
    for k, v in out.items():
        _say(k, v)

    half = size // 2
    b = _random_file(tmp / "b.bin", half)
    c = _random_file(tmp / "c.bin", half)
    subprocess.run(["cat", str(b), str(c)], stdout=subprocess.DEVNULL, check=True)
    with ThreadPoolExecutor(2) as pool:
        one = _best(lambda: hash_uri(b.as_uri()))
        two = _best(lambda: [f.result() for f in [pool.submit(hash_uri, p.as_uri()) for p in (b, c)]])
    out["parallel_speedup"] = round(2 * one / two, 2)
    _say("parallel_speedup", out["parallel_speedup"])
    for p in (a, b, c):
        p.unlink()

    big = _sparse_file(tmp / "big.bin", round(rss_gib * GIB))
    # The child resets its peak RSS (clear_refs 5) after imports, hashes, and reports
    # the peak (VmHWM) minus the resident size it started hashing with.
    child = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tinct.artifacts.hashing import hash_uri\n"
        "def kb(field):\n"
        "    line = next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith(field))\n"
        "    return int(line.split()[1])\n"
        "Path('/proc/self/clear_refs').write_text('5')\n"
        "base = kb('VmRSS:')\n"
        "hash_uri(sys.argv[1])\n"
        "print((kb('VmHWM:') - base) / 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child, big.as_uri()], capture_output=True, text=True, check=True
    )
    out["hash_peak_rss_mb"] = round(float(proc.stdout.strip()), 1)
    _say("hash_peak_rss_mb", out["hash_peak_rss_mb"])
    big.unlink()
    return out


def _event(i: int, model: str, now: datetime) -> dict[str, list[dict[str, Any]]]:
    eid = f"uid-{i}/1/registered"
    return {
        "model_versions": [
            {
                "event_id": eid,
                "event": "registered",
                "model": model,
                "version": "1.0.0",
                "uid": f"uid-{i}",
                "generation": 1,
                "onnx_sha256": f"{i:064x}",
                "recorded_at": now,
            }
        ],
        "artifacts": [
            {
                "event_id": eid,
                "uid": f"uid-{i}",
                "generation": 1,
                "model": model,
                "version": "1.0.0",
                "uri": f"s3://models/{model}/{i}/model.onnx",
                "format": "onnx",
                "sha256": f"{i:064x}",
                "size": 1000,
                "recorded_at": now,
            }
        ],
    }


def _digests(n: int) -> Any:
    """``n`` distinct random sha256 hex digests, as an Arrow string array."""
    import pyarrow as pa

    raw = pa.py_buffer(os.urandom(32 * n).hex().encode())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(64), n, [None, raw]).cast(pa.string())


#: The files of one version as the operator records them: format, file name.
_FILES = (
    ("onnx", "model.onnx"),
    ("ptx", "kernels.ptx"),
    ("safetensors", "model-00001-of-00002.safetensors"),
    ("safetensors", "model-00002-of-00002.safetensors"),
    ("source", "step-{i}.pt"),
)


def _filled_rows(start: int, stop: int) -> dict[str, Any]:
    """model_versions and artifacts rows of versions ``start..stop``, every column the operator fills."""
    import pyarrow as pa

    from tinct import __version__
    from tinct.lineage.schemas import ARTIFACTS, MODEL_VERSIONS

    ids = range(start, stop)
    n = len(ids)
    now = datetime.now(UTC)
    model = [f"model-{i % 1000}" for i in ids]
    version = [f"1.{i // 1000}.0" for i in ids]
    event_id = [f"uid-{i}/1/registered" for i in ids]
    uid = [f"uid-{i}" for i in ids]
    recorded = pa.array([now] * n, pa.timestamp("us", tz="UTC"))
    onnx, ptx, shard1, shard2, source = (_digests(n) for _ in range(5))
    versions = pa.Table.from_pydict(
        {
            "event_id": event_id,
            "event": ["registered"] * n,
            "model": model,
            "version": version,
            "namespace": ["llm"] * n,
            "name": [f"{m}-{v.replace('.', '-')}" for m, v in zip(model, version, strict=True)],
            "uid": uid,
            "generation": pa.array([1] * n, pa.int64()),
            "onnx_sha256": onnx,
            "ptx_sha256": ptx,
            "safetensors_sha256": _digests(n),  # the shards' combined digest
            "source_sha256": source,
            "source_uri": [f"s3://checkpoints/{m}/step-{i}.pt" for m, i in zip(model, ids, strict=True)],
            "build_pipeline_id": [f"pipeline-{i}" for i in ids],
            "quantization_method": ["awq"] * n,
            "quantization_bits": pa.array([4] * n, pa.int32()),
            "quantization_symmetric": [True] * n,
            "quantization_group_size": pa.array([128] * n, pa.int32()),
            "runtime": ["vllm"] * n,
            "reason": pa.nulls(n, pa.string()),
            "message": pa.nulls(n, pa.string()),
            "operator_version": [__version__] * n,
            "recorded_at": recorded,
        },
        schema=MODEL_VERSIONS,
    )
    parts = []
    for (fmt, name), digest in zip(_FILES, (onnx, ptx, shard1, shard2, source), strict=True):
        parts.append(
            pa.Table.from_pydict(
                {
                    "event_id": event_id,
                    "uid": uid,
                    "generation": pa.array([1] * n, pa.int64()),
                    "model": model,
                    "version": version,
                    "uri": [
                        f"s3://models/{m}/{v}/{name.format(i=i)}"
                        for m, v, i in zip(model, version, ids, strict=True)
                    ],
                    "format": [fmt] * n,
                    "sha256": digest,
                    "size": pa.array([(i * 7919 + len(name)) % (8 * GIB) for i in ids], pa.int64()),
                    "recorded_at": recorded,
                },
                schema=ARTIFACTS,
            )
        )
    return {"model_versions": versions, "artifacts": pa.concat_tables(parts)}


def _table_bytes(store: Any, name: str) -> int:
    """Bytes of the active data files of a table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(store.table(name).get_add_actions(flatten=True))
    return int(pc.sum(actions["size_bytes"]).as_py())


def bench_delta(tmp: Path) -> dict[str, Any]:
    from deltalake import write_deltalake

    from tinct.lineage.sql import history, query
    from tinct.lineage.store import LineageStore
    from tinct.lineage.writer import BatchWriter

    out: dict[str, Any] = {}
    root = tmp / "record"
    writer = BatchWriter(LineageStore(str(root))).start()
    lat = []
    for i in range(200):
        ev = _event(i, f"model-{i % 10}", datetime.now(UTC))
        t = time.perf_counter()
        writer.submit(ev).result()
        lat.append(time.perf_counter() - t)
    writer.close()
    out["record_p50_ms"] = round(statistics.median(lat) * 1000, 1)
    _say("record_p50_ms", out["record_p50_ms"])

    root = tmp / "million"
    store = LineageStore(str(root))
    store.ensure()
    n = 1_000_000
    for start in range(0, n, 200_000):
        rows = _filled_rows(start, min(n, start + 200_000))
        for name, table in rows.items():
            write_deltalake(str(root / name), table, mode="append")
    store.maintain(["model_versions", "artifacts"], vacuum=False)
    times = []
    for k in range(5):
        t = time.perf_counter()
        got = history(f"model-{k * 7}", str(root))
        times.append(time.perf_counter() - t)
        assert got.num_rows == 1000, got.num_rows
        assert got.column("safetensors_sha256").null_count == 0
    out["query_1m_rows_ms"] = round(statistics.median(times) * 1000, 1)
    out["query_1m_rows_table_bytes"] = _table_bytes(store, "model_versions")
    times = []
    for k in range(5):
        model = f"model-{k * 7 + 1}"
        t = time.perf_counter()
        got = query(
            "SELECT m.version, a.uri, a.format, a.sha256, a.size FROM artifacts a "
            "JOIN model_versions m ON a.event_id = m.event_id "
            f"WHERE a.model = '{model}' AND m.model = '{model}' ORDER BY m.version, a.uri",
            str(root),
        )
        times.append(time.perf_counter() - t)
        assert got.num_rows == 5000, got.num_rows
    out["artifacts_query_ms"] = round(statistics.median(times) * 1000, 1)
    out["artifacts_table_bytes"] = _table_bytes(store, "artifacts")
    for key in (
        "query_1m_rows_ms",
        "query_1m_rows_table_bytes",
        "artifacts_query_ms",
        "artifacts_table_bytes",
    ):
        _say(key, out[key])

    root = tmp / "tenk"
    store = LineageStore(str(root))
    writer = BatchWriter(store).start()
    with ThreadPoolExecutor(16) as pool:
        futures = [
            pool.submit(lambda i=i: writer.submit(_event(i, "m", datetime.now(UTC))).result())
            for i in range(10_000)
        ]
        for f in futures:
            f.result()
    writer.close()
    commits = store.table("model_versions").version()
    store.maintain()
    out["files_after_10k_events"] = len(store.table("model_versions").file_uris())
    _say("files_after_10k_events", out["files_after_10k_events"])
    _say("commits_for_10k_events", commits)
    return out


def _distinct_files(directory: Path, i: int) -> list[dict[str, str]]:
    """Five small files of version ``i``, different from every other version's."""
    from tinct_testing.lineage_artifacts import PTX_TEXT, make_onnx, make_safetensors

    directory.mkdir(parents=True, exist_ok=True)
    onnx = make_onnx(directory / "model.onnx", dim=16 + i)
    ptx = directory / "kernels.ptx"
    ptx.write_text(f"{PTX_TEXT}// build {i}\n")
    shards = [
        make_safetensors(directory / f"model-0000{k}-of-00002.safetensors", seed=2 * i + k, rows=1024)
        for k in (1, 2)
    ]
    source = _random_file(directory / "step.pt", 64 * 1024)
    return [
        {"format": "onnx", "uri": onnx.as_uri()},
        {"format": "ptx", "uri": ptx.as_uri()},
        *({"format": "safetensors", "uri": p.as_uri()} for p in shards),
        {"format": "source", "uri": source.as_uri()},
    ]


def _version(ns: str, i: int, files: list[dict[str, str]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": f"model-{i % 50}",
        "version": f"1.{i}.0",
        "artifacts": [f for f in files if f["format"] != "source"],
    }
    source = [f for f in files if f["format"] == "source"]
    if source:
        spec["source"] = {"uri": source[0]["uri"]}
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": f"mv-{i}", "namespace": ns},
        "spec": spec,
    }


def _apply_until_ready(cp: Any, ns: str, items: list[dict[str, Any]], root: Path) -> float | None:
    """Seconds from one ``kubectl apply`` of ``items`` until all are Ready; None if not, or duplicates."""
    import yaml

    from tinct.lineage.sql import query

    t0 = time.perf_counter()
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    ready = 0

    def all_ready() -> bool:
        nonlocal ready
        got = json.loads(cp.kubectl("get", "modelversions", "-n", ns, "-o", "json").stdout)
        ready = sum(1 for o in got["items"] if (o.get("status") or {}).get("phase") == "Ready")
        return ready == len(items)

    with contextlib.suppress(AssertionError):  # not all Ready in time: the figure is None
        eventually(all_ready, timeout=900, interval=1, what=f"{len(items)} ModelVersions Ready")
    elapsed = time.perf_counter() - t0
    rows = query(
        f"SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM model_versions WHERE namespace = '{ns}'",
        str(root),
    ).to_pylist()[0]
    _say(f"{ns}: ready", f"{ready}/{len(items)}")
    _say(f"{ns}: rows", rows)
    return round(elapsed, 1) if ready == len(items) and rows["n"] == rows["d"] == ready else None


def bench_cluster(tmp: Path, versions: int) -> dict[str, Any]:
    from tinct_testing.controlplane.harness import ControlPlane, free_port
    from tinct_testing.controlplane.process import http_ok, spawned, wait_ready
    from tinct_testing.lineage_artifacts import make_onnx, make_ptx
    from tinct_testing.measure import status_mb

    onnx = make_onnx(tmp / "model.onnx")
    ptx = make_ptx(tmp / "kernels.ptx")
    shared = [{"format": "onnx", "uri": onnx.as_uri()}, {"format": "ptx", "uri": ptx.as_uri()}]
    distinct = [_distinct_files(tmp / "distinct" / str(i), i) for i in range(versions)]
    _say("distinct artifact bytes", sum(Path(f["uri"][7:]).stat().st_size for fs in distinct for f in fs))
    root = tmp / "lineage"
    out: dict[str, Any] = {}
    with ControlPlane() as cp:
        cp.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        cp.wait_established("crd/modelversions.tinct.io")
        for ns in ("bench-shared", "bench-distinct"):
            cp.kubectl("create", "namespace", ns)
        env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "TINCT_LINEAGE_ROOT": str(root),
            "TINCT_ARTIFACT_ROOTS": str(tmp),
        }
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        argv = [sys.executable, "-m", "tinct.cli", "operator", "-n", "bench-shared", "-n", "bench-distinct"]
        with spawned([*argv, "--liveness", liveness], tmp / "operator.log", env, grace=60) as op:
            wait_ready("the operator", lambda: http_ok(liveness), op, time.monotonic() + 120)
            out["apply_1000_same_two_files_to_ready_s"] = _apply_until_ready(
                cp, "bench-shared", [_version("bench-shared", i, shared) for i in range(versions)], root
            )
            _say("apply_1000_same_two_files_to_ready_s", out["apply_1000_same_two_files_to_ready_s"])
            out["apply_1000_distinct_artifacts_to_ready_s"] = _apply_until_ready(
                cp,
                "bench-distinct",
                [_version("bench-distinct", i, distinct[i]) for i in range(versions)],
                root,
            )
            _say("apply_1000_distinct_artifacts_to_ready_s", out["apply_1000_distinct_artifacts_to_ready_s"])
            out["operator_rss_mb"] = round(status_mb(op.pid, "VmHWM"), 1)
            _say("operator_rss_mb", out["operator_rss_mb"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-cluster", action="store_true", help="print null for the cluster figures")
    p.add_argument("--hash-gib", type=float, default=1.0)
    p.add_argument("--rss-gib", type=float, default=4.0)
    p.add_argument("--versions", type=int, default=1000)
    args = p.parse_args()
    if round(args.hash_gib * GIB) < MIN_HASH_BYTES:
        p.error(
            f"--hash-gib {args.hash_gib} is under {MIN_HASH_BYTES // MIB} MiB: that times start-up, not hashing"
        )
    if round(args.rss_gib * GIB) < MIN_HASH_BYTES:
        p.error(
            f"--rss-gib {args.rss_gib} is under {MIN_HASH_BYTES // MIB} MiB: too small to show a bounded peak"
        )
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tinct-bench-lineage-", ignore_cleanup_errors=True) as d:
        tmp = Path(d)
        result.update(bench_hashing(tmp, args.hash_gib, args.rss_gib))
        result.update(bench_delta(tmp))
        if args.skip_cluster:
            result.update(
                apply_1000_same_two_files_to_ready_s=None,
                apply_1000_distinct_artifacts_to_ready_s=None,
                operator_rss_mb=None,
            )
        else:
            result.update(bench_cluster(tmp, args.versions))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
