"""One router process serves several GrayReleases, each picked by the request's OpenAI model.

Two releases of two models in one namespace, neither listing ``spec.models``: the operator
names each table after the ``model`` of the release's ModelVersions, and one
`tinct router --watch` process (no selector) follows both tables and routes every request
by its ``model`` field to that release's schedulers; a model no table names gets the
OpenAI-style 404.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tinct.api.routing import configmap_name
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.engines import Engines
from tinct_testing.lineage_artifacts import make_onnx
from tinct_testing.release_cluster import (
    HOLD,
    apply,
    example,
    get,
    modelversion,
    operator,
    service,
    table,
    wait_release,
)
from tinct_testing.release_traffic import Router, complete, router
from tinct_testing.repeat import Repeating
from tinct_testing.wait import WAIT, eventually


def _release(
    name: str, mvs: tuple[str, str], services: tuple[str, str], urls: tuple[str, str], weights: list[float]
) -> dict[str, Any]:
    """The shipped example as release ``name``: one default cell, no HPAs, the stand-ins' URLs."""
    doc = example(analysis=HOLD, cells=[{"match": {}, "weights": weights}])
    doc["metadata"]["name"] = name
    doc["spec"].pop("autoscaling")
    for side, mv, svc, url in zip(("stable", "candidate"), mvs, services, urls, strict=True):
        backend = doc["spec"][side]
        backend.pop("deployment")
        backend.update(modelVersion=mv, service=svc, url=url)
    return doc


def _chat(name: str, chat: Engines, weights: list[float]) -> dict[str, Any]:
    """A release of llama3-8b from 1.4.0 (sched-v1) to 1.5.0 (sched-v2), served by ``chat``."""
    mvs, services = ("llama3-8b-1-4-0", "llama3-8b-1-5-0"), ("sched-v1", "sched-v2")
    return _release(name, mvs, services, (chat.v1.url, chat.v2.url), weights)


def _coder(name: str, coder: Engines, weights: list[float]) -> dict[str, Any]:
    """A release of coder-7b from 1.0.0 (coder-v1) to 1.1.0 (coder-v2), served by ``coder``."""
    mvs, services = ("coder-7b-1-0-0", "coder-7b-1-1-0"), ("coder-v1", "coder-v2")
    return _release(name, mvs, services, (coder.v1.url, coder.v2.url), weights)


@pytest.fixture
def fleet(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[tuple[Engines, Engines]]:
    """The engines of two models, chat's and coder's, with their Services and ModelVersions."""
    onnx = make_onnx(tmp_path / "model.onnx")
    apply(
        cluster,
        namespace,
        *(service(s) for s in ("sched-v1", "sched-v2", "coder-v1", "coder-v2")),
        modelversion("llama3-8b-1-4-0", "1.4.0", onnx),
        modelversion("llama3-8b-1-5-0", "1.5.0", onnx),
        modelversion("coder-7b-1-0-0", "1.0.0", onnx, model="coder-7b"),
        modelversion("coder-7b-1-1-0", "1.1.0", onnx, model="coder-7b"),
    )
    with Engines(("chat-v1", "chat-v2")) as chat, Engines(("coder-v1", "coder-v2")) as coder:
        yield chat, coder


def _ask(port: int, model: str, session: str) -> tuple[int, dict[str, Any]]:
    """A chat completion for ``model`` through the router: (status, JSON body)."""
    got = complete(port, model, session)
    return got.status, got.json()


def _in_force(r: Router, cluster: Cluster, ns: str, release: str) -> bool:
    """The router holds the table the operator last wrote for ``release``, models named."""
    got = table(cluster, ns, release)
    return got is not None and bool(got[1]["models"]) and r.table_version(release) == got[0]


def test_one_router_serves_two_releases_by_model(
    cluster: Cluster, namespace: str, tmp_path: Path, fleet: tuple[Engines, Engines]
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    chat, coder = fleet
    with operator(ns, root), router(ns, tmp_path / "router.log") as r:
        # "chat" sends nothing to its candidate at step 0, "coder" everything: each
        # table's weights hold for its own model only.
        apply(
            cluster,
            ns,
            _chat("chat", chat, [0, 100]),
            _coder("coder", coder, [100, 100]),
        )
        for name in ("chat", "coder"):
            wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", f"{name} started", name)
            eventually(
                partial(_in_force, r, cluster, ns, name),
                timeout=WAIT,
                what=f"the router to hold {name}'s table",
            )
        tables = {name: table(cluster, ns, name) for name in ("chat", "coder")}
        answers = {
            model: [_ask(r.port, model, f"s-{i}") for i in range(20)]
            for model in ("llama3-8b", "coder-7b", "mistral-7b")
        }

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
    assert [e.state.received for e in (chat.v1, chat.v2, coder.v1, coder.v2)] == [20, 0, 0, 20]


class _Steady(Repeating):
    """Requests for each of ``models`` in turn from a thread, counting (model, status, answered by)."""

    def __init__(self, port: int, models: tuple[str, ...]) -> None:
        self.port, self.models = port, models

    def step(self, worker: int, i: int) -> None:
        model = self.models[i % len(self.models)]
        try:
            status, doc = _ask(self.port, model, f"steady-{i}")
            self.tally((model, status, str(doc.get("model") or (doc.get("error") or {}).get("code"))))
        except OSError as e:
            self.tally((model, 0, type(e).__name__))

    def count(self, model: str, status: int | None = None, by: str | None = None) -> int:
        return sum(
            n
            for (m, s, b), n in self.outcomes.items()
            if m == model and (status is None or s == status) and (by is None or b == by)
        )


def test_deleting_a_release_never_makes_its_model_unavailable(
    cluster: Cluster, namespace: str, tmp_path: Path, fleet: tuple[Engines, Engines]
) -> None:
    ns, root = namespace, tmp_path / "lineage"
    chat, coder = fleet
    chat_doc, coder_doc = _chat("chat", chat, [0, 100]), _coder("coder", coder, [0, 100])
    with operator(ns, root), router(ns, tmp_path / "router.log") as r:
        apply(cluster, ns, chat_doc, coder_doc)
        for name in ("chat", "coder"):
            wait_release(cluster, ns, lambda s: s.get("phase") == "Progressing", f"{name} started", name)
        wait_release(cluster, ns, lambda s: s.get("attempt") == 1, "chat recorded")
        cluster.kubectl("annotate", "gr", "chat", "-n", ns, "tinct.io/action=promote@a1-x")
        wait_release(cluster, ns, lambda s: s.get("phase") == "Promoted", "chat Promoted")
        for name in ("chat", "coder"):
            eventually(
                partial(_in_force, r, cluster, ns, name),
                timeout=WAIT,
                what=f"the router to hold {name}'s table",
            )
        with _Steady(r.port, ("llama3-8b", "coder-7b")) as steady:
            time.sleep(1)  # traffic flows before the deletion
            # Promoted: its model stays with the candidate; in progress: with stable.
            cluster.kubectl("delete", "gr", "chat", "coder", "-n", ns)
            eventually(
                lambda: (
                    get(cluster, ns, "grayrelease", "chat") is None
                    and get(cluster, ns, "grayrelease", "coder") is None
                ),
                timeout=WAIT,
                what="both gone",
            )
            time.sleep(3)  # and for a while after it: every request must still be answered
            standing = {n: table(cluster, ns, n) for n in ("chat", "coder")}
            # A new release of llama3-8b takes the model over; its standing route goes.
            nxt = _release(
                "chat-next",
                ("llama3-8b-1-5-0", "llama3-8b-1-4-0"),
                ("sched-v2", "sched-v1"),
                (chat.v2.url, chat.v1.url),
                [0, 100],
            )
            nxt["spec"]["allowMajorUpgrade"] = True
            apply(cluster, ns, nxt)
            eventually(
                lambda: table(cluster, ns, "chat") is None,
                timeout=WAIT,
                what="the standing route retired",
            )
            time.sleep(2)  # traffic across the takeover, answered throughout
        # Remove: the route goes with the release.
        gone = _coder("coder-2", coder, [0, 100])
        gone["spec"]["routeOnDelete"] = "Remove"
        cluster.kubectl("delete", "configmap", configmap_name(ns, "coder"), "-n", ns)
        apply(cluster, ns, gone)
        eventually(partial(_in_force, r, cluster, ns, "coder-2"), timeout=WAIT, what="coder-2's table")
        cluster.kubectl("delete", "gr", "coder-2", "-n", ns)
        eventually(
            lambda: table(cluster, ns, "coder-2") is None, timeout=WAIT, what="coder-2's route removed"
        )
        eventually(lambda: _ask(r.port, "coder-7b", "after")[0] == 404, timeout=WAIT, what="404 for coder-7b")
    assert standing["chat"] is not None
    assert standing["chat"][1]["standing"] is True
    assert {c["weight"] for c in standing["chat"][1]["cells"]} == {100}
    assert standing["coder"] is not None
    assert {c["weight"] for c in standing["coder"][1]["cells"]} == {0}
    # Not one request of a served model was refused, before, during and after the deletions.
    assert sum(n for (_, status, _), n in steady.outcomes.items() if status != 200) == 0, steady.outcomes
    assert steady.count("llama3-8b") > 50
    assert steady.count("coder-7b") > 50
    # The promoted candidate (chat-v2) answered llama3-8b after chat went, then chat-next's
    # stable (chat-v2 again); coder's stable answered coder-7b throughout.
    assert steady.count("llama3-8b", 200, "chat-v2") > 0
    assert steady.count("coder-7b", 200, "coder-v2") == 0, "coder never went past stable"
