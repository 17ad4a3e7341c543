"""`make demo` is one of the README's two commands: it must keep working end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_demo_runs_end_to_end() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TINCT_TEST_KUBECONFIG"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert re.search(r"llama3-8b-1-4-0\s+llama3-8b\s+1\.4\.0\s+Ready", out)
    assert re.search(r"llama3-8b-2-0-1\s+llama3-8b\s+2\.0\.1\s+Failed", out)
    assert "Verified=False (DigestMismatch)" in out
    assert re.search(r"llama3-8b\s+2\.0\.0\s+registered", out), "lineage SQL shows the recorded event"
    short_user = re.search(r"short prompt / user / low .*: (\{.*\})", out)
    assert short_user, out
    assert "X-Fallback-Reason=version_mismatch answer='hello from v1'" in out
    assert 'reason="version_mismatch"' in out
