"""`make demo` is one of the README's two commands: it must keep working end to end."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from tinct_testing.paths import ROOT


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
    cells = {
        cell: ast.literal_eval(counts)
        for cell, counts in re.findall(r"(\w+ prompt / \w+ / \w+) .*: (\{.*\})", out)
    }
    assert set(cells) == {
        "long prompt / admin / high",
        "short prompt / user / low",
        "medium prompt / audit / low",
    }
    for cell, counts in cells.items():
        assert set(counts) <= {"v1", "v2"}, (cell, counts)
        assert sum(counts.values()) == 200, (cell, counts)
    # 200 sticky sessions per cell at step 1: short/user sends 1% to v2 (2 expected), the
    # default cell 10% (20), long/admin 20% (40). The bounds are > 3.5 standard deviations.
    assert cells["short prompt / user / low"].get("v2", 0) <= 10, cells
    assert 5 <= cells["medium prompt / audit / low"].get("v2", 0) <= 40, cells
    assert 20 <= cells["long prompt / admin / high"].get("v2", 0) <= 65, cells
    assert "X-Fallback-Reason=version_mismatch answer='Emulated answer from v1'" in out
    assert 'reason="version_mismatch"' in out
    # The operator drives both releases under Prometheus analysis.
    assert "GrayRelease llm/chat  phase Paused  step 2/4" in out
    # What LLM users feel, in `tinct release status`: time to first token, the engine's queue.
    paused = re.search(r"GrayRelease llm/chat  phase Paused.*?\n\n", out, re.S)
    assert paused, out
    assert re.search(r"^\s+ttft-p95\s+[\d.]+\s+<= 1500 ms", paused.group(0), re.M), paused.group(0)
    assert re.search(
        r"^\s+queue-depth\s+[\d.]+\s+<= 8 requests .*\(vllm:num_requests_waiting\)", paused.group(0), re.M
    )
    assert re.search(r"chat: Promoted step 4/4 -- promoted after step 3/4: analysis passed", out)
    assert re.search(r"chat-2: RolledBack step 1/4 -- rolled back at step 1/4 after 2 failed analyses", out)
    matrix = re.search(r"GrayRelease llm/chat-2  phase RolledBack.*?\n(.*?)\n\n", out, re.S)
    assert matrix, out
    assert re.search(r"len:long\+role:admin\+latency:high\s+5\s+20\s+50\s+100\s+0\n", matrix.group(1))
    history = re.findall(r"^\s+(chat(?:-2)?)\s+(\w+)\s+(\d)\s+llama3-8b-2-0-0\s+([\d.]+)\s", out, re.M)
    assert history == [
        ("chat", "Progressing", "1", "5.0"),
        ("chat", "Progressing", "2", "20.0"),
        ("chat", "Paused", "2", "20.0"),
        ("chat", "Progressing", "2", "20.0"),
        ("chat", "Progressing", "3", "50.0"),
        ("chat", "Promoted", "4", "100.0"),
        ("chat-2", "Progressing", "1", "5.0"),
        ("chat-2", "RolledBack", "1", "0.0"),
    ]
