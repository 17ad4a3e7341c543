"""One router process serves several GrayReleases, each picked by the request's OpenAI model.

Two releases of two models in one namespace, neither listing ``spec.models``: the operator
names each table after the ``model`` of the release's ModelVersions, and one
`tinct router --watch` process (no selector) follows both tables and routes every request
by its ``model`` field to that release's schedulers; a model no table names gets the
OpenAI-style 404.
"""

from __future__ import annotations

import http.client
import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from controlplane.harness import Cluster
from lineage_artifacts import make_onnx
from release_cluster import apply, example, get, modelversion, operator, service, wait, wait_release
from release_traffic import Router, router
from router_fakes import BackgroundSchedulers
from tinct.api.routing import DATA_KEY, VERSION_ANNOTATION

pytestmark = pytest.mark.usefixtures("crds")

NO_METRICS = {"interval": "1h", "prometheus": {"url": "http://127.0.0.1:9"}, "metrics": []}


def _release(
    name: str, mvs: tuple[str, str], services: tuple[str, str], urls: tuple[str, str], weights: list[float]
) -> dict[str, Any]:
    """The shipped example as release ``name``: one default cell, no HPAs, the stand-ins' URLs."""
    doc = example(analysis=NO_METRICS, cells=[{"match": {}, "weights": weights}])
    doc["metadata"]["name"] = name
    doc["spec"].pop("autoscaling")
    for side, mv, svc, url in zip(("stable", "candidate"), mvs, services, urls, strict=True):
        backend = doc["spec"][side]
        backend.pop("deployment")
        backend.update(modelVersion=mv, service=svc, url=url)
    return doc


def _table(cluster: Cluster, ns: str, release: str) -> tuple[int, dict[str, Any]] | None:
    cm = get(cluster, ns, "configmap", f"tinct-routing-{release}")
    if cm is None:
        return None
    return int(cm["metadata"]["annotations"][VERSION_ANNOTATION]), json.loads(cm["data"][DATA_KEY])


def _ask(port: int, model: str, session: str) -> tuple[int, dict[str, Any]]:
    """A chat completion for ``model`` through the router: (status, JSON body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", "X-Session-Id": session},
        )
        resp = conn.getresponse()
        doc: dict[str, Any] = json.loads(resp.read() or b"{}")
        return resp.status, doc
    finally:
        conn.close()


def _in_force(r: Router, cluster: Cluster, ns: str, release: str) -> bool:
    """The router holds the table the operator last wrote for ``release``, models named."""
    got = _table(cluster, ns, release)
    return got is not None and bool(got[1]["models"]) and r.table_version(release) == got[0]


def test_one_router_serves_two_releases_by_model(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    ns, root = namespace, tmp_path / "lineage"
    chat = BackgroundSchedulers(("chat-v1", "chat-v2"))
    coder = BackgroundSchedulers(("coder-v1", "coder-v2"))
    try:
        onnx = make_onnx(tmp_path / "model.onnx")
        apply(
            cluster,
            ns,
            *(service(s) for s in ("sched-v1", "sched-v2", "coder-v1", "coder-v2")),
            modelversion("llama3-8b-1-4-0", "1.4.0", onnx),
            modelversion("llama3-8b-1-5-0", "1.5.0", onnx),
            modelversion("coder-7b-1-0-0", "1.0.0", onnx, model="coder-7b"),
            modelversion("coder-7b-1-1-0", "1.1.0", onnx, model="coder-7b"),
        )
        with operator(ns, root), router(ns, tmp_path / "router.log") as r:
            # "chat" sends nothing to its candidate at step 0, "coder" everything: each
            # table's weights hold for its own model only.
            apply(
                cluster,
                ns,
                _release(
                    "chat",
                    ("llama3-8b-1-4-0", "llama3-8b-1-5-0"),
                    ("sched-v1", "sched-v2"),
                    (chat.v1.url, chat.v2.url),
                    [0, 100],
                ),
                _release(
                    "coder",
                    ("coder-7b-1-0-0", "coder-7b-1-1-0"),
                    ("coder-v1", "coder-v2"),
                    (coder.v1.url, coder.v2.url),
                    [100, 100],
                ),
            )
            for name in ("chat", "coder"):
                wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", f"{name} started", name)
                wait(f"the router to hold {name}'s table", partial(_in_force, r, cluster, ns, name))
            tables = {name: _table(cluster, ns, name) for name in ("chat", "coder")}
            answers = {
                model: [_ask(r.port, model, f"s-{i}") for i in range(20)]
                for model in ("llama3-8b", "coder-7b", "mistral-7b")
            }
    finally:
        chat.stop()
        coder.stop()

    assert {name: t[1]["models"] for name, t in tables.items() if t} == {
        "chat": ["llama3-8b"],
        "coder": ["coder-7b"],
    }
    assert {(status, doc["model"]) for status, doc in answers["llama3-8b"]} == {(200, "chat-v1")}
    assert {(status, doc["model"]) for status, doc in answers["coder-7b"]} == {(200, "coder-v2")}
    assert {status for status, _ in answers["mistral-7b"]} == {404}
    error = answers["mistral-7b"][0][1]["error"]
    assert (error["code"], error["type"]) == ("model_not_found", "invalid_request_error")
    assert "mistral-7b" in error["message"]
    # Every request reached exactly the scheduler its model's table chose.
    assert (len(chat.v1.seen), len(chat.v2.seen), len(coder.v1.seen), len(coder.v2.seen)) == (20, 0, 0, 20)
