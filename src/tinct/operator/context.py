"""The operator's process state, kept in kopf's ``memo``: config, thread pools, lineage writer.

kopf hands every handler a ``memo``, a per-object copy of the operator's root memo. The
startup activity registered here puts one :class:`Context` into the root memo before any
object is handled, so every handler of every module reaches the same state with
:func:`of`::

    @kopf.on.create(GROUP, VERSION, PLURAL)
    async def handle(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        ctx = context.of(memo)
        ctx.config.lineage_root                 # the OperatorConfig the process runs with
        await ctx.writer.record(rows)           # the one lineage writer

``tinct operator`` hands its :class:`OperatorConfig` over in the root memo
(:func:`memo_for`); under ``kopf run -m tinct.operator.modelversion`` the startup reads it
from the environment. Before the lineage writer starts, the startup checks that the store
under the lineage root refuses a second commit of one table version
(:func:`tinct.lineage.commits.check_commits`), and fails the operator if it does not, unless
``lineage_single_writer`` says no other replica writes. The cleanup activity closes the
context. The login activity uses the cluster access of :mod:`tinct.kubeconfig`.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from tinct.artifacts.fair import FairPool
from tinct.kubeconfig import kopf_login
from tinct.lineage.store import LineageStore
from tinct.lineage.writer import BatchWriter
from tinct.operator.kube import StatusPatcher
from tinct.operator.settings import OperatorConfig, configure

__all__ = ["Context", "config_of", "memo_for", "of"]

_Logger = logging.Logger | logging.LoggerAdapter[Any]
_CONFIG = "tinct_config"
_CONTEXT = "tinct_context"


@dataclass
class Context:
    config: OperatorConfig
    hashing: FairPool  # reads of artifacts, shared fairly between versions
    io: ThreadPoolExecutor  # short blocking calls: status patches, table setup
    writer: BatchWriter
    status: StatusPatcher = field(default_factory=StatusPatcher)

    @property
    def store(self) -> LineageStore:
        return self.writer.store

    @classmethod
    def open(cls, config: OperatorConfig) -> Context:
        return cls(
            config=config,
            hashing=FairPool(config.hash_workers),
            io=ThreadPoolExecutor(4, thread_name_prefix="tinct-io"),
            writer=BatchWriter(LineageStore(config.lineage_root, config.storage)),
        )

    def close(self) -> None:
        """Stop hashing at once, commit what the writer holds, stop the pools (blocking)."""
        self.hashing.shutdown()
        self.writer.close()
        self.io.shutdown(wait=False, cancel_futures=True)


def memo_for(config: OperatorConfig) -> kopf.Memo:
    """A root memo that hands ``config`` to the startup activity."""
    memo = kopf.Memo()
    memo[_CONFIG] = config
    return memo


def config_of(memo: Any) -> OperatorConfig:
    """The config ``tinct operator`` handed over in the root memo, else the environment's."""
    config = memo.get(_CONFIG)
    return config if isinstance(config, OperatorConfig) else OperatorConfig.from_env()


def of(memo: Any) -> Context:
    """The process's context, from the ``memo`` any handler receives."""
    ctx = memo.get(_CONTEXT)
    if not isinstance(ctx, Context):
        raise RuntimeError("the operator context is not started (the startup activity has not run)")
    return ctx


@kopf.on.login()
def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    info: kopf.ConnectionInfo | None = kopf_login(**kwargs)
    return info


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: Any, logger: _Logger, **_: Any) -> None:
    config = config_of(memo)
    configure(settings, config)
    ctx = Context.open(config)
    memo[_CONTEXT] = ctx
    loop = asyncio.get_running_loop()
    if config.lineage_single_writer:
        logger.warning("single writer: conditional writes of %s not checked", config.lineage_root)
    else:
        from tinct.lineage.commits import check_commits
        from tinct.lineage.errors import LineageError

        try:  # done already, and not again, when tinct operator started this process
            await loop.run_in_executor(ctx.io, check_commits, config.lineage_root, config.storage)
        except LineageError as exc:
            raise kopf.PermanentError(str(exc)) from None
    await loop.run_in_executor(ctx.io, ctx.writer.start)
    logger.info("lineage tables under %s", config.lineage_root)


@kopf.on.cleanup()
async def _cleanup(memo: Any, **_: Any) -> None:
    ctx = memo.pop(_CONTEXT, None)
    if isinstance(ctx, Context):
        await asyncio.get_running_loop().run_in_executor(None, ctx.close)
