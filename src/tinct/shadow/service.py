"""``tinct comparer``'s process: the pair endpoint, the bounded queue, the comparison worker.

- ``POST /v1/pairs`` (:func:`_pairs`): ``Authorization: Bearer <token>`` (401 without it),
  ``application/x-ndjson``, at most :data:`MAX_LINES` lines and :data:`MAX_REQUEST_BYTES`
  bytes (413 beyond). Each line is parsed (:func:`~tinct.shadow.pair.parse_pair`) and
  admitted (:func:`~tinct.shadow.intake.admit`); an admitted pair goes on the queue, or is
  dropped and counted when the queue is full (never waited for). The answer is ``202``
  ``{"accepted": n, "refused": m}``.
- One worker takes pairs off the queue and compares them in a thread
  (:func:`~tinct.shadow.compare.compare`: JSON parsing and rapidfuzz stay off the loop that
  takes pairs in); a difference the judge is asked about (a sample, within the judge's
  budget) is finished in a task of its own, so a slow judge delays no other pair. Each
  verdict is counted (:mod:`tinct.shadow.metrics`) and recorded (:mod:`tinct.shadow.record`).
- ``GET /metrics``; ``GET /healthz``; ``GET /readyz`` (503 until the tables are listed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tinct.api.backends import FollowsTables
from tinct.router.sources import table_sources
from tinct.router.table import TableHolder
from tinct.shadow.compare import Outcome, compare
from tinct.shadow.intake import Accepted, Refused, admit
from tinct.shadow.judge import Judges, JudgeVerdict
from tinct.shadow.metrics import ComparerMetrics
from tinct.shadow.pair import Pair, PairError, parse_pair
from tinct.shadow.record import Recorder, row

__all__ = ["MAX_LINES", "MAX_REQUEST_BYTES", "Comparer", "ComparerConfig", "make_app", "serving"]

_log = logging.getLogger(__name__)

MAX_LINES = 1000
MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_PORT = 8090


@dataclass(frozen=True)
class ComparerConfig(FollowsTables):
    """Everything ``tinct comparer`` is told; the command's flags map onto it one to one."""

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    #: The bearer token routers send; None only with ``insecure_no_token``.
    token: str | None = None
    insecure_no_token: bool = False
    table_files: tuple[Path, ...] = ()
    watch: bool = False
    namespace: str | None = None
    selector: str = "tinct.io/routing-table=true"
    kubeconfig: Path | None = None
    context: str | None = None
    #: Root of the lineage tables; None: verdicts are counted, not recorded.
    lineage_root: str | None = None
    queue_size: int = 10000
    batch_rows: int = 500
    batch_seconds: float = 2.0
    judges: dict[str, str] = field(default_factory=dict)
    judge_concurrency: int = 4
    judge_per_minute: int = 120
    #: Backends a watched table may name besides its release's namespace's Services: the
    #: routers' list, so that the comparer follows the tables they follow.
    allow_backends: tuple[str, ...] = ()
    #: The cluster's DNS domain: ``<service>.<namespace>.svc.<cluster_domain>`` is a Service.
    cluster_domain: str = "cluster.local"


@dataclass
class Comparer:
    """The state of a running comparer."""

    config: ComparerConfig
    holder: TableHolder
    metrics: ComparerMetrics
    judges: Judges
    queue: asyncio.Queue[tuple[Pair, Accepted]]
    recorder: Recorder | None = None
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tinct-compare")
    )
    rng: random.Random = field(default_factory=random.Random)
    #: Judged pairs being finished.
    judging: set[asyncio.Task[None]] = field(default_factory=set)
    url: str = ""
    #: Pairs finished (counted, and recorded when a lineage root is set).
    done: int = 0

    def ready(self) -> bool:
        return self.holder.synced or bool(self.holder.tables)


COMPARER: web.AppKey[Comparer] = web.AppKey("comparer", Comparer)


def _authorized(c: Comparer, request: web.Request) -> bool:
    token = c.config.token
    if token is None:
        return c.config.insecure_no_token
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def _problem(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _pairs(request: web.Request) -> web.Response:
    c = request.app[COMPARER]
    if not _authorized(c, request):
        return _problem(401, "a bearer token is needed (the routers' --comparer-token-file)")
    if (request.content_length or 0) > MAX_REQUEST_BYTES:
        return _problem(413, f"over {MAX_REQUEST_BYTES} bytes in one request")
    try:
        body = await request.read()  # bounded by the application's client_max_size
    except web.HTTPRequestEntityTooLarge:
        return _problem(413, f"over {MAX_REQUEST_BYTES} bytes in one request")
    lines = [line for line in body.split(b"\n") if line.strip()]
    if len(lines) > MAX_LINES:
        return _problem(413, f"{len(lines)} pairs in one request; at most {MAX_LINES}")
    accepted = refused = 0
    for line in lines:
        try:
            pair = parse_pair(line)
        except PairError as e:
            _log.debug("pair refused: %s", e)
            c.metrics.refused.labels("invalid").inc()
            refused += 1
            continue
        verdict = admit(c.holder, pair)
        if isinstance(verdict, Refused):
            c.metrics.refused.labels(verdict.reason).inc()
            refused += 1
            continue
        try:
            c.queue.put_nowait((pair, verdict))
        except asyncio.QueueFull:
            c.metrics.dropped.inc()
            refused += 1
            continue
        accepted += 1
    c.metrics.queue.set(c.queue.qsize())
    return web.json_response({"accepted": accepted, "refused": refused}, status=202)


async def _metrics(request: web.Request) -> web.Response:
    c = request.app[COMPARER]
    c.metrics.queue.set(c.queue.qsize())
    c.metrics.tables.set(sum(1 for _, t in c.holder.tables.values() if t.table.shadow is not None))
    return web.Response(
        body=generate_latest(c.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[COMPARER].ready():
        return web.Response(text="ready\n")
    return web.Response(status=503, text="waiting for the routing tables\n")


def _finish(c: Comparer, pair: Pair, acc: Accepted, out: Outcome, judged: JudgeVerdict | None) -> None:
    ns = pair.namespace
    if judged is not None:
        c.metrics.judge.labels(ns, pair.release, judged.outcome).inc()
        if judged.outcome == "match":
            out.verdict, out.layer = "same", "judge"
        elif judged.outcome == "mismatch":
            out.layer = "judge"
    c.metrics.pairs.labels(ns, pair.release, pair.dye_tag, pair.target, out.verdict).inc()
    if out.verdict == "skipped":
        c.metrics.skipped.labels(ns, pair.release, out.reason or "unknown").inc()
    if c.recorder is not None:
        c.recorder.add(row(pair, acc, out, judged, datetime.now(UTC)))
    c.done += 1


async def _judged(c: Comparer, pair: Pair, acc: Accepted, out: Outcome) -> None:
    judge = acc.settings.judge
    assert judge is not None
    verdict = await c.judges.judge(judge, out.prompt, out.stable_text, out.candidate_text)
    _finish(c, pair, acc, out, verdict)


async def _work(c: Comparer) -> None:
    loop = asyncio.get_running_loop()
    while True:
        pair, acc = await c.queue.get()
        try:
            out = await loop.run_in_executor(c.executor, compare, pair, acc.settings)
        except Exception:  # a pair that breaks the comparison is a bug; it must not stop the rest
            _log.exception("comparing a pair of %s/%s failed", pair.namespace, pair.release)
            continue
        judge = acc.settings.judge
        if out.judgeable and judge is not None and c.rng.random() < judge.sample_rate:
            task = asyncio.create_task(_judged(c, pair, acc, out))
            c.judging.add(task)
            task.add_done_callback(c.judging.discard)
        else:
            _finish(c, pair, acc, out, None)


def make_app(c: Comparer) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[COMPARER] = c
    app.router.add_post("/v1/pairs", _pairs)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


def _writer(config: ComparerConfig) -> Any:
    """The lineage writer of the ``shadow_pairs`` table (its only writer), or None."""
    if config.lineage_root is None:
        return None
    from tinct.lineage.schemas import COMPARER_TABLES
    from tinct.lineage.store import LineageStore
    from tinct.lineage.writer import BatchWriter

    return BatchWriter(LineageStore(config.lineage_root, owns=COMPARER_TABLES)).start()


@contextlib.asynccontextmanager
async def serving(config: ComparerConfig, *, holder: TableHolder | None = None) -> AsyncIterator[Comparer]:
    """Run a comparer for the duration of the block (port 0: a free port)."""
    if config.token is None and not config.insecure_no_token:
        raise ValueError(
            "no token: give --comparer-token-file (or TINCT_COMPARER_TOKEN), or --insecure-no-token"
        )
    c = Comparer(
        config,
        holder or TableHolder(),
        ComparerMetrics(),
        Judges(config.judges, concurrency=config.judge_concurrency, per_minute=config.judge_per_minute),
        asyncio.Queue(config.queue_size),
    )
    writer = _writer(config)
    if writer is not None:

        def submit(rows: list[dict[str, Any]]) -> Future[int]:
            return writer.submit({"shadow_pairs": rows}, version_of="shadow_pairs")  # type: ignore[no-any-return]

        def recorded(n: int, error: BaseException | None) -> None:
            (c.metrics.record_errors if error else c.metrics.recorded).inc(1 if error else n)

        c.recorder = Recorder(
            submit, batch_rows=config.batch_rows, batch_seconds=config.batch_seconds, on_done=recorded
        )
        c.recorder.start()
    reloaders: list[Callable[[], None]] = []
    runner = web.AppRunner(make_app(c), access_log=None, shutdown_timeout=2.0)
    worker = asyncio.create_task(_work(c), name="tinct-shadow-compare")
    try:
        # The routers post the Events of rejected tables; the comparer follows them quietly.
        async with table_sources(config, c.holder, reloaders, post_events=False):
            await runner.setup()
            site = web.TCPSite(runner, config.host, config.port)
            await site.start()
            port = runner.addresses[0][1]
            host = f"[{config.host}]" if ":" in config.host else config.host
            c.url = f"http://{host}:{port}"
            yield c
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        for task in list(c.judging):
            task.cancel()
        await runner.cleanup()
        await c.judges.close()
        if c.recorder is not None:
            await c.recorder.close()
        if writer is not None:
            await asyncio.get_running_loop().run_in_executor(None, writer.close)
        c.executor.shutdown(wait=False)
