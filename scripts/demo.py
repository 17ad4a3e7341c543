"""tinct end to end on this machine: `make demo`.

Starts a real kube-apiserver + etcd (the test harness's), installs the CRDs, runs the
operator and the router as the `tinct` command would in a cluster, and walks through:

1. three ModelVersions whose artifacts are real files written here (ONNX, sharded
   safetensors, PTX, a checkpoint): two reach Ready, one with a wrong declared digest
   fails with the reason in its status;
2. the lineage tables, queried with `tinct lineage sql`;
3. a GrayRelease driven by the operator under analysis by a real Prometheus scraping the
   routers and the engines (time to first token, inter-token latency, throttling, queue depth): it steps to 1, is paused there with `tinct release pause` while OpenAI-client
   requests from different dye cells land on v1 or v2 (and on v1 again, inside the same
   request, when v2 answers 426), then resumed to Promoted; a second release of a candidate
   answering 503 is rolled back; `tinct release status` prints each matrix and SQL over
   `release_events` tells the story.

The two schedulers are emulated LLM engines (`tinct emulator`: no GPU, no model weights
here); everything else is the real thing. Everything is torn down at the end.
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

from tinct_testing.controlplane import build
from tinct_testing.controlplane.harness import ControlPlane
from tinct_testing.controlplane.process import http_ok, spawned, wait_ready
from tinct_testing.controlplane.prometheus import Prometheus
from tinct_testing.engines import Engines
from tinct_testing.lineage_artifacts import make_artifact_set
from tinct_testing.paths import ROOT
from tinct_testing.release_cluster import apply, deployment, service
from tinct_testing.release_traffic import LONG_ADMIN_HIGH_STREAMED, MEDIUM_AUDIT_LOW, Background, router
from tinct_testing.wait import eventually

NS = "llm"
TINCT = str(Path(sys.executable).parent / "tinct")


def say(msg: str) -> None:
    print(f"\n\033[1m==> {msg}\033[0m", flush=True)


def show(text: str) -> None:
    print("    " + text.rstrip().replace("\n", "\n    "), flush=True)


def wait_for(what: str, check: Any, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    """Until ``check()`` holds, while ``proc`` runs."""
    wait_ready(what, check, proc, time.monotonic() + timeout, interval=0.3)


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
    say("starting a real kube-apiserver + etcd + kube-controller-manager (built from Go modules, cached)")
    with ControlPlane() as cp:
        v = cp.version()
        show(f"kube-apiserver {v['gitVersion']} ready at {cp.server}")
        env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig), TINCT_LINEAGE_ROOT=str(lineage))

        say("kubectl apply -f crds/")
        show(cp.kubectl("apply", "-f", str(ROOT / "crds")).stdout)
        cp.wait_established("crd/modelversions.tinct.io", "crd/grayreleases.tinct.io")
        cp.kubectl("create", "namespace", NS)

        say(f"writing model artifacts under {work}/models (ONNX, 2 safetensors shards, PTX, checkpoint)")
        v140 = make_artifact_set(work / "models" / "1.4.0")
        v200 = make_artifact_set(work / "models" / "2.0.0")

        models = work / "models"
        say(
            "Prometheus (built from its Go module, cached): the operator's one, scraping the routers every second"
        )
        prom = Prometheus(build.ensure_prometheus(), work / "prometheus").start()
        say(
            f"tinct operator --namespace {NS} --table-namespace {NS} --prometheus-url {prom.url} "
            f"--lineage-root {lineage} --artifact-root {models} --allow-backend 127.0.0.1"
        )
        with (
            contextlib.closing(prom),
            spawned(
                [
                    TINCT,
                    "operator",
                    "--namespace",
                    NS,
                    "--table-namespace",
                    NS,
                    "--prometheus-url",
                    prom.url,
                    "--lineage-root",
                    str(lineage),
                    "--artifact-root",
                    str(models),
                    # The emulated engines listen on loopback, outside any namespace.
                    "--allow-backend",
                    "127.0.0.1",
                ],
                work / "operator.log",
                env,
            ) as op,
        ):
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

            wait_for("ModelVersions to settle", phases, op)
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

            backends = Engines()  # tinct emulator, one per side: no model runs here
            try:
                gray_releases(cp, env, work, lineage, backends, op, prom)
            finally:
                backends.stop()
    say(f"done; logs were in {work} (removed)")
    with contextlib.suppress(OSError):
        import shutil

        shutil.rmtree(work)
    return 0


def tinct(env: dict[str, str], *args: str) -> str:
    return subprocess.run([TINCT, *args], env=env, check=True, capture_output=True, text=True).stdout


def release_doc(name: str, backends: Engines) -> dict[str, Any]:
    """examples/grayrelease.yaml as shipped (it reads the operator's Prometheus, judging TTFT,
    ITL and the engines' queue depth too), but with the schedulers on loopback, an 8 s
    interval so the demo stays short, and no autoscaling."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "grayrelease.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    for side, engine in (("stable", backends.v1), ("candidate", backends.v2)):
        # On loopback, the engines' series are told apart by their scrape address.
        spec[side].update(url=engine.url, metricsSelector={"instance": f"127.0.0.1:{engine.port}"})
    spec["analysis"].update(interval="8s", minRequests=3)  # time enough to pause at step 1
    # The demo runs no KEDA (make dev does): the example's queue-depth scaling is left out.
    spec.pop("autoscaling", None)
    # An ejected candidate gets no requests for the cooldown; the demo's is short.
    spec["fallback"]["cooldownSeconds"] = 2
    return doc


def status(cp: ControlPlane, name: str) -> dict[str, Any]:
    obj = json.loads(cp.kubectl("get", "gr", name, "-n", NS, "-o", "json").stdout)
    st: dict[str, Any] = obj.get("status") or {}
    return st


def follow(
    cp: ControlPlane, name: str, until: Any, op: subprocess.Popen[bytes], timeout: float = 90
) -> dict[str, Any]:
    """Print each new phase/step of ``name`` until ``until(status)`` holds."""
    seen: tuple[Any, ...] = ()

    def arrived() -> dict[str, Any] | None:
        nonlocal seen
        if op.poll() is not None:
            raise SystemExit(f"the operator exited with {op.returncode}")
        st = status(cp, name)
        now = (st.get("phase"), st.get("progress"))
        if st and now != seen:
            seen = now
            show(f"{name}: {st.get('phase')} step {st.get('progress', '-')} -- {st.get('message', '')}")
        return st if st and until(st) else None

    st: dict[str, Any] = eventually(
        arrived, timeout=timeout, interval=0.3, what=f"{name} followed to its state"
    )
    return st


def gray_releases(
    cp: ControlPlane,
    env: dict[str, str],
    work: Path,
    lineage: Path,
    backends: Engines,
    op: subprocess.Popen[bytes],
    prom: Prometheus,
) -> None:
    say("Services and Deployments of the two schedulers (their Pods run on the simulated node)")
    apply(cp, NS, *(f(n) for f in (service, deployment) for n in ("sched-v1", "sched-v2")))
    with (
        router(NS, work / "router.log", "chat", env) as r,
        router(NS, work / "router-2.log", "chat-2", env) as r2,
    ):
        port, port2 = r.port, r2.port
        engines = [f"127.0.0.1:{backends.v1.port}", f"127.0.0.1:{backends.v2.port}"]
        prom.set_targets([f"127.0.0.1:{port}", f"127.0.0.1:{port2}", *engines])
        say("Prometheus scrapes both routers and both engines' /metrics (vLLM's names, emulated)")
        say("kubectl apply -f examples/grayrelease.yaml  (schedulers on loopback, 8 s analysis interval)")
        show(apply(cp, NS, release_doc("chat", backends)))
        # The long cell streams (SSE), so each window has the tokens the analysis times.
        cells = [LONG_ADMIN_HIGH_STREAMED, LONG_ADMIN_HIGH_STREAMED, MEDIUM_AUDIT_LOW]
        with Background(port, cells):
            follow(cp, "chat", lambda st: st.get("step") == 1, op)
            say("tinct release pause chat   (hold step 1 while we look at it)")
            show(tinct(env, "release", "pause", "chat", "-n", NS))
            follow(cp, "chat", lambda st: st.get("phase") == "Paused", op)
            say("tinct release status chat")
            show(tinct(env, "release", "status", "chat", "-n", NS))
            wait_for(
                "the router on the step-1 table", lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), r.proc
            )
            run_requests(port, backends)
            time.sleep(3)  # the ejection's cooldown ends: the router tries v2 again
            say("tinct release resume chat   (Prometheus analysis each interval until Promoted)")
            show(tinct(env, "release", "resume", "chat", "-n", NS))
            follow(cp, "chat", lambda st: st.get("phase") == "Promoted", op)
        say("tinct release status chat")
        show(tinct(env, "release", "status", "chat", "-n", NS))

        say("v2 starts answering 503; a second release, chat-2, tries the same candidate")
        backends.set(backends.v2, error_rate=1)
        apply(cp, NS, release_doc("chat-2", backends))
        with Background(port2, cells):
            follow(cp, "chat-2", lambda st: st.get("phase") == "RolledBack", op)
        say("tinct release status chat-2")
        show(tinct(env, "release", "status", "chat-2", "-n", NS))
        say("kubectl get events (GrayRelease)")
        show(
            cp.kubectl(
                "get",
                "events",
                "-n",
                NS,
                "--field-selector",
                "involvedObject.kind=GrayRelease",
                "--sort-by=.metadata.creationTimestamp",
                "-o",
                "custom-columns=OBJECT:.involvedObject.name,TYPE:.type,REASON:.reason,MESSAGE:.message",
            ).stdout
        )
    query = (
        "SELECT release, state, step, to_model_version AS candidate, "
        "weights['len:long+role:admin+latency:high'] AS long_admin_high, "
        "substr(reason, 1, 60) AS reason FROM release_events ORDER BY recorded_at"
    )
    say(f'tinct lineage sql "{query}"')
    show(tinct(env, "lineage", "sql", "--root", str(lineage), query))


def run_requests(port: int, backends: Engines) -> None:
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
    backends.set(backends.v2, accept_versions=["v3"])  # serves scheduler v3 only now
    for session in on_candidate[:4]:
        side, reason, answer = ask(session, "admin", "high", 2000)
        show(
            f"session {session} (sticky on v2): X-Scheduler-Active={side} X-Fallback-Reason={reason} answer={answer!r}"
        )
    backends.set(backends.v2, accept_versions=[])
    with urllib_get(f"http://127.0.0.1:{port}/metrics") as text:
        lines = [
            ln
            for ln in text.splitlines()
            if ln.startswith(("tinct_router_fallbacks_total", "tinct_router_candidate_ejections_total"))
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
