"""tinct end to end on this machine: `make demo`.

Starts a real kube-apiserver + etcd (the test harness's), installs the CRDs, runs the
operator and the router as the `tinct` command would in a cluster, and walks through:

1. three ModelVersions whose artifacts are real files written here (ONNX, sharded
   safetensors, PTX, a checkpoint): two reach Ready, one with a wrong declared digest
   fails with the reason in its status;
2. the lineage tables, queried with `tinct lineage sql`;
3. a GrayRelease and its routing table, served by `tinct router --watch`: OpenAI-client
   requests from different dye cells land on v1 or v2, and when v2 answers 426 the router
   falls back to v1 inside the same request.

The two schedulers are small local stand-ins for LLM serving backends (no GPU, no
model weights here); everything else is the real thing. Everything is torn down at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from controlplane.harness import ControlPlane  # noqa: E402
from lineage_artifacts import make_artifact_set  # noqa: E402
from router_fakes import BackgroundSchedulers, free_port  # noqa: E402
from tinct.api.routing import routing_configmap, routing_table_from  # noqa: E402
from tinct.api.v1alpha1 import GrayRelease  # noqa: E402

NS = "llm"
TINCT = str(Path(sys.executable).parent / "tinct")


def say(msg: str) -> None:
    print(f"\n\033[1m==> {msg}\033[0m", flush=True)


def show(text: str) -> None:
    print("    " + text.rstrip().replace("\n", "\n    "), flush=True)


@contextlib.contextmanager
def process(argv: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(
    what: str, check: Any, timeout: float = 90.0, proc: subprocess.Popen[bytes] | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited with {proc.returncode}")
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {what}")


def modelversion(name: str, version: str, arts: Any, *, wrong_digest: bool = False) -> dict[str, Any]:
    def uri(p: Path) -> str:
        return f"file://{p}"

    safetensors: list[dict[str, Any]] = [{"format": "safetensors", "uri": uri(p)} for p in arts.shards]
    if wrong_digest:
        safetensors[0]["sha256"] = hashlib.sha256(b"not this file").hexdigest()
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": "llama3-8b",
            "version": version,
            "source": {"uri": uri(arts.source)},
            "artifacts": [
                {"format": "onnx", "uri": uri(arts.onnx)},
                {"format": "ptx", "uri": uri(arts.ptx)},
                *safetensors,
            ],
            "buildPipelineId": f"ci-{version.replace('.', '')}",
            "quantization": {"method": "awq", "bits": 4, "symmetric": True, "groupSize": 128},
            "runtime": "vllm",
        },
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="tinct-demo-"))
    lineage = work / "lineage"
    say("starting a real kube-apiserver + etcd (built from Go modules, cached)")
    with ControlPlane() as cp:
        v = cp.version()
        show(f"kube-apiserver {v['gitVersion']} ready at {cp.server}")
        env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig), TINCT_LINEAGE_ROOT=str(lineage))

        say("kubectl apply -f crds/")
        show(cp.kubectl("apply", "-f", str(ROOT / "crds")).stdout)
        cp.kubectl(
            "wait", "--for=condition=Established", "crd/modelversions.tinct.io", "crd/grayreleases.tinct.io"
        )
        cp.kubectl("create", "namespace", NS)

        say(f"writing model artifacts under {work}/models (ONNX, 2 safetensors shards, PTX, checkpoint)")
        v140 = make_artifact_set(work / "models" / "1.4.0")
        v200 = make_artifact_set(work / "models" / "2.0.0")

        say(f"tinct operator --namespace {NS} --lineage-root {lineage}")
        with process(
            [TINCT, "operator", "--namespace", NS, "--lineage-root", str(lineage)], work / "operator.log", env
        ) as op:
            docs = [
                modelversion("llama3-8b-1-4-0", "1.4.0", v140),
                modelversion("llama3-8b-2-0-0", "2.0.0", v200),
                modelversion("llama3-8b-2-0-1", "2.0.1", v200, wrong_digest=True),
            ]
            say("kubectl apply three ModelVersions (2.0.1 declares a wrong sha256 for a shard)")
            show(cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs)).stdout)

            def phases() -> dict[str, str] | None:
                out = cp.kubectl("get", "mv", "-n", NS, "-o", "json").stdout
                got = {
                    i["metadata"]["name"]: i.get("status", {}).get("phase", "")
                    for i in json.loads(out)["items"]
                }
                return got if all(p in ("Ready", "Failed") for p in got.values()) else None

            wait_for("ModelVersions to settle", phases, proc=op)
            say("kubectl get mv -n llm -o wide")
            show(cp.kubectl("get", "mv", "-n", NS, "-o", "wide").stdout)
            failed = json.loads(cp.kubectl("get", "mv", "llama3-8b-2-0-1", "-n", NS, "-o", "json").stdout)
            show(
                "2.0.1 conditions: "
                + "; ".join(
                    f"{c['type']}={c['status']} ({c.get('reason', '')})"
                    for c in failed["status"].get("conditions", [])
                )
            )
            ready = json.loads(cp.kubectl("get", "mv", "llama3-8b-2-0-0", "-n", NS, "-o", "json").stdout)
            show("2.0.0 status.digests: " + json.dumps(ready["status"]["digests"], indent=None)[:300])
            show(f"2.0.0 status.lineage: {ready['status'].get('lineage')}")
            events = cp.kubectl(
                "get",
                "events",
                "-n",
                NS,
                "--field-selector",
                "involvedObject.kind=ModelVersion",
                "-o",
                "custom-columns=OBJECT:.involvedObject.name,TYPE:.type,REASON:.reason,MESSAGE:.message",
            ).stdout
            say("kubectl get events (ModelVersion)")
            show(events)

        query = "SELECT model, version, event, substr(safetensors_sha256, 1, 16) AS safetensors, build_pipeline_id FROM model_versions ORDER BY version"
        say(f'tinct lineage sql "{query}"')
        show(
            subprocess.run(
                [TINCT, "lineage", "sql", "--root", str(lineage), query],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )

        backends = BackgroundSchedulers()
        try:
            say("kubectl apply -f examples/grayrelease.yaml, and its routing table at step 1 as a ConfigMap")
            gr_doc = yaml.safe_load((ROOT / "examples" / "grayrelease.yaml").read_text())
            show(cp.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(gr_doc)).stdout)
            gr_doc["metadata"]["namespace"] = NS
            release = GrayRelease.model_validate(gr_doc)
            table = routing_table_from(release, step=1, state="Progressing", version=1, cluster_domain="")
            # The schedulers run on loopback here instead of behind Services.
            table = table.model_copy(
                update={
                    "stable": table.stable.model_copy(update={"url": backends.v1.url}),
                    "candidate": table.candidate.model_copy(update={"url": backends.v2.url}),
                }
            )
            cp.kubectl(
                "apply",
                "--server-side",
                "--field-manager=tinct-demo",
                "-f",
                "-",
                input=json.dumps(routing_configmap(table)),
            )
            show(
                "weights at step 1: "
                + ", ".join(
                    f"{c.match.prompt_length or '*'}/{c.match.role or '*'}/{c.match.latency or '*'}={c.weight}%"
                    for c in table.cells
                )
            )

            port = free_port()
            say(f"tinct router --watch --namespace {NS} --port {port}")
            with process(
                [
                    TINCT,
                    "router",
                    "--watch",
                    "--namespace",
                    NS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--trust-role-from",
                    "127.0.0.1/32",
                ],
                work / "router.log",
                env,
            ) as router:
                import urllib.request

                def ready() -> bool:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                            return bool(r.status == 200)
                    except OSError:
                        return False

                wait_for("the router to load the table", ready, proc=router)
                run_requests(port, backends)
        finally:
            backends.stop()
    say(f"done; logs were in {work} (removed)")
    with contextlib.suppress(OSError):
        import shutil

        shutil.rmtree(work)
    return 0


def run_requests(port: int, backends: BackgroundSchedulers) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="demo", max_retries=0)

    def ask(session: str, role: str, latency: str, words: int) -> tuple[str, str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="llama3-8b",
            messages=[{"role": "user", "content": "tell me about dye tags " * words}],
            extra_headers={"X-Session-Id": session, "X-User-Role": role, "X-Latency-Class": latency},
        )
        answer = raw.parse().choices[0].message.content or ""
        return raw.headers.get("x-scheduler-active", "?"), raw.headers.get("x-fallback-reason", "-"), answer

    say("OpenAI client -> router: 200 sessions per cell, counting which scheduler answered")
    on_candidate: list[str] = []
    for label, role, latency, words in (
        ("long prompt / admin / high (20% at step 1)", "admin", "high", 2000),
        ("short prompt / user / low  (1% at step 1)", "user", "low", 5),
        ("medium prompt / audit / low (default cell, 10%)", "audit", "low", 300),
    ):
        counts: dict[str, int] = {}
        for i in range(200):
            side, _, _ = ask(f"{role}-{latency}-{i}", role, latency, words)
            counts[side] = counts.get(side, 0) + 1
            if side == "v2" and role == "admin":
                on_candidate.append(f"{role}-{latency}-{i}")
        show(f"{label}: {counts}")
    side1, _, _ = ask("sticky-7", "admin", "high", 2000)
    same = all(ask("sticky-7", "admin", "high", 2000)[0] == side1 for _ in range(5))
    show(f"session sticky-7 always lands on {side1}: {same}")

    say("v2 starts answering 426 (version mismatch): the router retries on v1 in the same request")
    backends.v2.reset("mismatch")
    for session in on_candidate[:4]:
        side, reason, answer = ask(session, "admin", "high", 2000)
        show(
            f"session {session} (sticky on v2): X-Scheduler-Active={side} X-Fallback-Reason={reason} answer={answer!r}"
        )
    backends.v2.reset("ok")
    with urllib_get(f"http://127.0.0.1:{port}/metrics") as text:
        lines = [
            ln
            for ln in text.splitlines()
            if ln.startswith(("tinct_router_fallbacks_total", "tinct_router_ejections_total"))
        ]
    say("router /metrics (fallbacks, ejections)")
    show("\n".join(lines) or "(none)")


@contextlib.contextmanager
def urllib_get(url: str) -> Iterator[str]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        yield r.read().decode()


if __name__ == "__main__":
    sys.exit(main())
