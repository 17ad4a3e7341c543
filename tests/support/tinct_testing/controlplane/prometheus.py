"""A real Prometheus server for tests: file-discovered targets, 1 s scrape and evaluation.

The binary comes from ``build.ensure_prometheus`` (built from the Go module). A test
points it at routers with :meth:`Prometheus.set_targets`, which rewrites the file_sd file
Prometheus watches, and reads results with :meth:`Prometheus.query`. :meth:`stop` and
:meth:`start` keep the port and the data directory, so a test can simulate an outage and
a recovery of the same server.
"""

from __future__ import annotations

import atexit
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from tinct_testing.controlplane.harness import free_port
from tinct_testing.controlplane.process import Process, Workdir, http_ok, wait_ready
from tinct_testing.wait import eventually

JOB = "tinct"


class Prometheus:
    """One Prometheus process on ``127.0.0.1:<port>``; a context manager as well."""

    def __init__(
        self,
        binary: Path,
        workdir: Path | None = None,
        *,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        rule_files: Sequence[Path] = (),
        host: str = "127.0.0.1",
    ) -> None:
        """``host``: the address to listen on; a node's IP makes it reachable from its Pods."""
        self.binary = binary
        self._workdir = Workdir(workdir, "tinct-prom-")
        self.workdir = self._workdir.path
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = host
        self.url = f"http://{host}:{self.port}"
        self.targets_file = self.workdir / "targets.json"
        self.config_file = self.workdir / "prometheus.yml"
        self.data_dir = self.workdir / "data"
        self.log = self.workdir / "prometheus.log"
        self._proc: Process | None = None
        self._closed = False
        # No retries: a test asking a stopped server wants the refusal now, not after backoff.
        self._client = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=0), timeout=10)
        self.set_targets([])
        self.config_file.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": scrape_interval,
                        "scrape_timeout": scrape_interval,
                        "evaluation_interval": evaluation_interval,
                    },
                    **({"rule_files": [str(f) for f in rule_files]} if rule_files else {}),
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            # The file is watched (inotify); the refresh is a fallback.
                            "file_sd_configs": [
                                {"files": [str(self.targets_file)], "refresh_interval": "1s"}
                            ],
                        }
                    ],
                }
            )
        )

    # -- targets ---------------------------------------------------------------------

    def set_targets(
        self,
        targets: Sequence[str],
        labels: Mapping[str, str] | None = None,
        *,
        wait: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """Scrape exactly ``targets`` (``host:port``) from now on, each with ``labels``.

        The file is replaced atomically, so Prometheus never reads half of it. Prometheus
        passes discovery changes on at most every 5 s, so the change takes effect within
        a few seconds; ``wait=True`` returns only once every target was scraped and is up.
        """
        self.set_target_groups([(targets, labels or {})] if targets else [], wait=wait, timeout=timeout)

    def set_target_groups(
        self,
        groups: Sequence[tuple[Sequence[str], Mapping[str, str]]],
        *,
        wait: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """:meth:`set_targets` with labels of their own for each group of targets (e.g. the
        ``namespace`` and ``service`` an engine's series are selected by)."""
        targets = [t for ts, _ in groups for t in ts]
        for t in targets:
            host, sep, port = t.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"a target is host:port, got {t!r}")
        doc = [{"targets": list(ts), "labels": dict(labels)} for ts, labels in groups if ts]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.targets_file)
        if wait:
            self.wait_for_targets(targets, timeout)

    def wait_for_targets(self, targets: Sequence[str], timeout: float = 30.0) -> None:
        """Return when each of ``targets`` is an active target that was scraped and is up."""

        def all_up() -> bool:
            seen = self.active_targets()
            up = {t["labels"].get("instance") for t in seen if t.get("health") == "up"}
            state = [(t["labels"].get("instance"), t.get("health"), t.get("lastError")) for t in seen]
            assert set(targets) <= up, f"targets (instance, health, last error): {state}"
            return True

        eventually(all_up, timeout=timeout, what=f"targets {list(targets)} all up")

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> Prometheus:
        """Start (or restart) on the same port with the same data; return when ready."""
        if self._closed:
            raise RuntimeError("this Prometheus was closed; create a new one")
        if self.alive():
            return self
        atexit.register(self.close)
        self._proc = Process(
            [
                str(self.binary),
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address={self.host}:{self.port}",
                "--storage.tsdb.retention.time=2h",
                # Apply discovered target changes within 1 s of discovery passing them on
                # (default 5 s), so set_targets takes effect in seconds.
                "--scrape.discovery-reload-interval=1s",
                "--log.level=warn",
            ],
            self.log,
            append=True,
        )
        wait_ready("prometheus", self.ready, self._proc, time.monotonic() + timeout, interval=0.1)
        return self

    def stop(self) -> None:
        """Stop the process; the port and the data stay for :meth:`start`."""
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def close(self) -> None:
        """Stop for good and remove the working directory if this object made it."""
        self._closed = True
        try:
            self.stop()
        finally:
            self._workdir.remove()
            atexit.unregister(self.close)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    @property
    def pid(self) -> int | None:
        return self._proc.proc.pid if self._proc is not None and self._proc.alive() else None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------

    def ready(self) -> bool:
        return http_ok(f"{self.url}/-/ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query through the HTTP API: the ``data.result`` list.

        Raises ``requests.ConnectionError`` at once when Prometheus is down, and
        ``PrometheusApiClientException`` when it rejects the query.
        """
        result: list[dict[str, Any]] = self._client.custom_query(query=promql)
        return result

    def wait_for(self, promql: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Poll ``promql`` until it returns a non-empty result; fail with the last answer."""
        result: list[dict[str, Any]] = eventually(
            lambda: self.query(promql),
            timeout=timeout,
            what=f"{promql!r} to return something",
            explain=lambda: f"targets: {self.active_targets()}",
        )
        return result

    def parse(self, promql: str) -> dict[str, Any]:
        """The syntax tree Prometheus parses ``promql`` into (``/api/v1/parse_query``);
        ``ValueError`` with its message when it does not parse."""
        url = f"{self.url}/api/v1/parse_query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                tree: dict[str, Any] = json.load(r)["data"]
                return tree
        except urllib.error.HTTPError as e:
            raise ValueError(json.load(e).get("error", str(e))) from None

    def rule_groups(self) -> list[dict[str, Any]]:
        """The loaded rule groups with each rule's health and last error (``/api/v1/rules``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=10) as r:
            groups: list[dict[str, Any]] = json.load(r)["data"]["groups"]
            return groups

    def active_targets(self) -> list[dict[str, Any]]:
        """The scrape targets with their health and last error, from ``/api/v1/targets``."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=5) as r:
            targets: list[dict[str, Any]] = json.load(r)["data"]["activeTargets"]
            return targets


__all__ = ["JOB", "Prometheus"]
