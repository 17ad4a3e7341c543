"""Driving ModelVersions on the real API server: apply, read, wait, run the operator.

Shared by the ``k8s`` tests of the ModelVersion operator. :class:`FileOpens` counts how
often the operator opens given files (Linux inotify), which is how a test tells whether
an artifact was read again without looking inside the operator.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kopf.testing import KopfRunner

from tinct.lineage.sql import query
from tinct_testing.controlplane.environ import patched_environ
from tinct_testing.controlplane.harness import Cluster
from tinct_testing.wait import WAIT, eventually


def mv_doc(name: str, artifacts: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """ModelVersion ``name`` of ``artifacts``: llama3-8b 1.0.0 unless ``spec`` says otherwise."""
    return {
        "apiVersion": "tinct.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {"model": spec.pop("model", "llama3-8b"), "version": "1.0.0", "artifacts": artifacts, **spec},
    }


def apply(cluster: Cluster, ns: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))


def get_object(cluster: Cluster, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    """The object as JSON, or None when it does not exist (or cannot be read)."""
    proc = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


def get(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    return get_object(cluster, ns, "modelversion", name)


def wait_phase(cluster: Cluster, ns: str, name: str, *phases: str, timeout: float = WAIT) -> dict[str, Any]:
    """The object once its phase is one of ``phases`` for its current generation."""

    def check() -> dict[str, Any] | None:
        obj = get(cluster, ns, name)
        st = (obj or {}).get("status") or {}
        gen = (obj or {}).get("metadata", {}).get("generation")
        if st.get("phase") in phases and st.get("observedGeneration") == gen:
            return obj
        return None

    obj: dict[str, Any] = eventually(check, timeout=timeout, what=f"{name} in {phases}")
    return obj


def hashing(cluster: Cluster, ns: str, name: str) -> bool:
    st = (get(cluster, ns, name) or {}).get("status") or {}
    return st.get("phase") == "Hashing" and st.get("progress", {}).get("bytesDone", 0) > 0


def cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


@contextmanager
def operator(ns: str, root: Path, artifact_root: Path | None, **env: str) -> Iterator[KopfRunner]:
    """The operator in this process (``kopf run -m``), configured from the environment."""
    roots = {"TINCT_ARTIFACT_ROOTS": str(artifact_root)} if artifact_root is not None else {}
    with patched_environ(TINCT_LINEAGE_ROOT=str(root), TINCT_PROGRESS_INTERVAL="0.3", **roots, **env):
        args = ["run", "-m", "tinct.operator.modelversion", "--standalone", "--namespace", ns]
        with KopfRunner(args, timeout=60) as runner:
            yield runner
        assert runner.exception is None, runner.output
        assert runner.exit_code == 0, runner.output


def rows(root: Path, sql: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = query(sql, str(root)).to_pylist()
    return out


def sparse_file(path: Path, size: int) -> Path:
    """``size`` bytes that cost no disk but are still read and hashed byte by byte."""
    with path.open("wb") as f:
        f.truncate(size)
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    return path


def big_safetensors(path: Path, size: int) -> Path:
    """A valid safetensors file of about ``size`` bytes (one U8 tensor, sparse data)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + size)
    return path


class FileOpens:
    """Counts opens of the watched files by any process (inotify ``IN_OPEN``), and how many
    of those are still open (closes are ``IN_CLOSE_NOWRITE``)."""

    _IN_OPEN = 0x20
    _IN_CLOSE_NOWRITE = 0x10
    _EVENT = struct.Struct("iIII")

    def __init__(self, *paths: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._names: dict[int, str] = {}
        for p in paths:
            wd = self._libc.inotify_add_watch(
                self._fd, str(p).encode(), self._IN_OPEN | self._IN_CLOSE_NOWRITE
            )
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {p}")
            self._names[wd] = p.name
        self.counts = dict.fromkeys(self._names.values(), 0)
        self.open_now = 0

    def take(self) -> dict[str, int]:
        """Opens per file name since the last call; :attr:`open_now` is brought up to date."""
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            pos = 0
            while pos < len(buf):
                wd, mask, _, length = self._EVENT.unpack_from(buf, pos)
                pos += self._EVENT.size + length
                if wd not in self._names:
                    continue
                if mask & self._IN_OPEN:
                    self.counts[self._names[wd]] += 1
                    self.open_now += 1
                if mask & self._IN_CLOSE_NOWRITE:
                    self.open_now -= 1
        out, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return out

    def close(self) -> None:
        os.close(self._fd)
