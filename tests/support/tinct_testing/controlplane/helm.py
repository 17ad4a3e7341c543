"""Run the helm built from its Go module against the test cluster, with its own home."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class HelmError(subprocess.CalledProcessError):
    """helm exited non-zero; the message carries its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


class Helm:
    """``helm`` with a kubeconfig and private cache/config/data dirs (the user's stay untouched)."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.home = home
        self.kubeconfig = kubeconfig
        home.mkdir(parents=True, exist_ok=True)

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        config = kubeconfig or self.kubeconfig
        if config is not None:
            env["KUBECONFIG"] = str(config)
        return env

    def __call__(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: Path | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``helm *args``; ``check`` raises with helm's stderr on a non-zero exit."""
        proc = subprocess.run(
            [str(self.binary), *args],
            input=input,
            text=True,
            capture_output=True,
            env=self.env(kubeconfig),
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise HelmError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc


__all__ = ["Helm", "HelmError"]
