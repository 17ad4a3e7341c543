"""Process-wide operator state shared by handlers: config, thread pools, lineage writer.

Created once in a kopf startup handler (:func:`start`), closed on cleanup (:func:`stop`).
Other handler modules (GrayRelease) reach the same lineage writer via :func:`current`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tinct.lineage.store import LineageStore
from tinct.lineage.writer import BatchWriter
from tinct.operator.settings import OperatorConfig

__all__ = ["Context", "current", "start", "stop"]


@dataclass
class Context:
    config: OperatorConfig
    hashing: ThreadPoolExecutor
    verifying: ThreadPoolExecutor
    io: ThreadPoolExecutor
    writer: BatchWriter

    @property
    def store(self) -> LineageStore:
        return self.writer.store


_current: Context | None = None


def start(config: OperatorConfig | None = None) -> Context:
    """Create (or return) the process's context."""
    global _current
    if _current is None:
        config = config or OperatorConfig.from_env()
        store = LineageStore(config.lineage_root, config.storage)
        _current = Context(
            config=config,
            hashing=ThreadPoolExecutor(config.hash_workers, thread_name_prefix="tinct-hash"),
            # One thread per version being verified; each waits on its files in `hashing`.
            verifying=ThreadPoolExecutor(8, thread_name_prefix="tinct-verify"),
            io=ThreadPoolExecutor(4, thread_name_prefix="tinct-io"),
            writer=BatchWriter(store),
        )
    return _current


def current() -> Context:
    if _current is None:
        raise RuntimeError("operator context is not started")
    return _current


def stop() -> None:
    global _current
    ctx, _current = _current, None
    if ctx is not None:
        ctx.writer.close()
        ctx.hashing.shutdown(wait=False, cancel_futures=True)
        ctx.verifying.shutdown(wait=False, cancel_futures=True)
        ctx.io.shutdown(wait=False, cancel_futures=True)
