"""Lineage benchmark: hashing, Delta writes/queries, and 1,000 ModelVersions to Ready.

Prints one line per figure as it is measured, then the whole result as JSON on the last
line. Everything lives in a temporary directory that is removed at the end.

    python bench/lineage.py [--skip-cluster] [--hash-gib 1] [--rss-gib 4] [--versions 1000]

- hash_mb_s / openssl_mb_s / hash_ratio: one file of random bytes (page cache warm),
  ours (``tinct.artifacts.hashing.hash_uri``) vs ``openssl dgst -sha256``, best of 3 each.
- parallel_speedup: time for 1 file / time for 2 equal files hashed at once, times 2.
- hash_peak_rss_mb: peak RSS growth of a child process hashing a sparse 4 GiB file.
- record_p50_ms: one event through the BatchWriter (MERGE of model_versions and
  artifacts) on local disk, 200 events in sequence, maintenance as the operator runs it.
- query_1m_rows_ms: ``tinct.lineage.history(model)`` over 1,000,000 compacted rows,
  median of 5 (includes opening the tables).
- files_after_10k_events: 10,000 one-event submissions from 16 threads (as concurrent
  reconciles do), the writer's own maintenance running as in the operator, then one
  more maintenance; active data files of model_versions.
- apply_1000_to_ready_s / operator_rss_mb: the control plane from tests/controlplane,
  ``tinct operator`` as a subprocess, 1,000 ModelVersions applied in one kubectl call,
  time until all are Ready; peak RSS (VmHWM) of the operator; duplicates are checked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MIB = 1024 * 1024


def _say(name: str, value: Any) -> None:
    print(f"{name}: {value}", flush=True)


def _random_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        for _ in range(size // (16 * MIB)):
            f.write(os.urandom(16 * MIB))
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

    size = int(gib * 1024) * MIB
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

    big = _sparse_file(tmp / "big.bin", int(rss_gib * 1024) * MIB)
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


def bench_delta(tmp: Path) -> dict[str, Any]:
    import pyarrow as pa
    from deltalake import write_deltalake

    from tinct.lineage.schemas import MODEL_VERSIONS
    from tinct.lineage.sql import history
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
    now = datetime.now(UTC)
    ids = pa.array([f"uid-{i}/1/registered" for i in range(n)])
    cols: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in MODEL_VERSIONS}
    cols.update(
        event_id=ids,
        event=pa.array(["registered"] * n),
        model=pa.array([f"model-{i % 1000}" for i in range(n)]),
        version=pa.array([f"1.{i // 1000}.0" for i in range(n)]),
        uid=pa.array([f"uid-{i}" for i in range(n)]),
        generation=pa.array([1] * n, pa.int64()),
        recorded_at=pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    )
    table = pa.Table.from_pydict(cols, schema=MODEL_VERSIONS)
    write_deltalake(str(root / "model_versions"), table, mode="append")
    store.maintain(["model_versions"], vacuum=False)
    times = []
    for k in range(5):
        t = time.perf_counter()
        got = history(f"model-{k * 7}", str(root))
        times.append(time.perf_counter() - t)
        assert got.num_rows == 1000, got.num_rows
    out["query_1m_rows_ms"] = round(statistics.median(times) * 1000, 1)
    _say("query_1m_rows_ms", out["query_1m_rows_ms"])

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


def _vmhwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_cluster(tmp: Path, versions: int) -> dict[str, Any]:
    import yaml

    from controlplane.harness import ControlPlane
    from lineage_artifacts import make_onnx, make_ptx
    from tinct.lineage.sql import query

    onnx = make_onnx(tmp / "model.onnx")
    ptx = make_ptx(tmp / "kernels.ptx")
    root = tmp / "lineage"
    with ControlPlane() as cp:
        cp.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelversions.tinct.io")
        ns = "bench"
        cp.kubectl("create", "namespace", ns)
        env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "TINCT_LINEAGE_ROOT": str(root),
            "TINCT_ARTIFACT_ROOTS": str(tmp),
        }
        log = (tmp / "operator.log").open("w")
        op = subprocess.Popen(
            [sys.executable, "-m", "tinct.cli", "operator", "--namespace", ns],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(3)
            docs = {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "tinct.io/v1alpha1",
                        "kind": "ModelVersion",
                        "metadata": {"name": f"mv-{i}", "namespace": ns},
                        "spec": {
                            "model": f"model-{i % 50}",
                            "version": f"1.{i}.0",
                            "artifacts": [
                                {"format": "onnx", "uri": onnx.as_uri()},
                                {"format": "ptx", "uri": ptx.as_uri()},
                            ],
                        },
                    }
                    for i in range(versions)
                ],
            }
            t0 = time.perf_counter()
            cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(docs))
            ready = 0
            deadline = t0 + 600
            while time.perf_counter() < deadline:
                got = json.loads(cp.kubectl("get", "modelversions", "-n", ns, "-o", "json").stdout)
                ready = sum(1 for o in got["items"] if (o.get("status") or {}).get("phase") == "Ready")
                if ready == versions:
                    break
                time.sleep(1)
            elapsed = time.perf_counter() - t0
            rss = _vmhwm_mb(op.pid)
        finally:
            op.terminate()
            op.wait(timeout=60)
            log.close()
    rows = query(
        "SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM model_versions", str(root)
    ).to_pylist()[0]
    _say("ready", f"{ready}/{versions}")
    _say("rows", rows)
    out = {
        "apply_1000_to_ready_s": round(elapsed, 1) if ready == versions and rows["n"] == rows["d"] else None,
        "operator_rss_mb": round(rss, 1),
    }
    for k, v in out.items():
        _say(k, v)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-cluster", action="store_true", help="print null for the two cluster figures")
    p.add_argument("--hash-gib", type=float, default=1.0)
    p.add_argument("--rss-gib", type=float, default=4.0)
    p.add_argument("--versions", type=int, default=1000)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tinct-bench-lineage-"))
    result: dict[str, Any] = {}
    try:
        result.update(bench_hashing(tmp, args.hash_gib, args.rss_gib))
        result.update(bench_delta(tmp))
        if args.skip_cluster:
            result.update(apply_1000_to_ready_s=None, operator_rss_mb=None)
        else:
            result.update(bench_cluster(tmp, args.versions))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
