"""Every command a person types fails with one line saying what to do, never a traceback.

Each case runs ``tinct`` as a user would (a subprocess, the real entry point) and checks the
whole of stderr and the exit status, which ``--help`` documents.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tinct.cli import build_parser
from tinct.clierrors import EXIT_CODES
from tinct.lineage.store import LineageStore
from tinct_testing import commands
from tinct_testing.controlplane.harness import free_port
from tinct_testing.lineage_artifacts import lineage_event


def tinct(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``tinct ARGS`` without this machine's cluster settings, with ``env`` besides."""
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TINCT_CONTEXT", "TINCT_DEBUG")}
    return commands.tinct(*args, env={**base, **(env or {})}, timeout=timeout)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """stderr, which must be exactly one line and no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def kubeconfig(path: Path, **contexts: int) -> Path:
    """A kubeconfig with one context per name, each pointing at 127.0.0.1:<port>."""
    names = list(contexts)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": n,
                        "cluster": {"server": f"https://127.0.0.1:{p}", "insecure-skip-tls-verify": True},
                    }
                    for n, p in contexts.items()
                ],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": n, "context": {"cluster": n, "user": "me"}} for n in names],
                "current-context": names[0],
            }
        )
    )
    return path


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    proc = tinct("release", "status", "chat", "--kubeconfig", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert one_line(proc) == f"tinct release: kubeconfig {tmp_path / 'nope'}: no such file"


def test_a_kubeconfig_that_is_not_yaml_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text("clusters: [\n")
    proc = tinct("release", "status", "chat", "--kubeconfig", str(bad))
    assert proc.returncode == 2
    assert one_line(proc).startswith(f"tinct release: kubeconfig {bad}: is not YAML (")


def test_an_unknown_context_lists_the_known_ones(tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", dev=free_port(), prod=free_port())
    proc = tinct("release", "status", "chat", "--kubeconfig", str(kc), "--context", "staging")
    assert proc.returncode == 2
    assert one_line(proc) == f"tinct release: kubeconfig {kc}: has no context 'staging' (it has dev, prod)"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_unreachable_api_server_is_one_line_naming_it_and_context_picks_the_cluster(
    tmp_path: Path, how: str
) -> None:
    dev, prod = free_port(), free_port()
    kc = kubeconfig(tmp_path / "kc", dev=dev, prod=prod)
    if how == "flag":
        proc = tinct("release", "status", "chat", "--kubeconfig", str(kc), "--context", "prod")
    else:
        proc = tinct("release", "status", "chat", env={"KUBECONFIG": str(kc), "TINCT_CONTEXT": "prod"})
    assert proc.returncode == 1
    assert one_line(proc) == (
        f"tinct release: cannot reach the Kubernetes API server at https://127.0.0.1:{prod}: connection "
        f"refused; is the cluster up, and is kubeconfig {kc} (context prod) the one you mean? "
        "(--kubeconfig, --context)"
    )


def test_the_operator_exits_on_a_kubeconfig_it_cannot_use_instead_of_retrying(tmp_path: Path) -> None:
    proc = tinct("operator", "--kubeconfig", str(tmp_path / "nope"), timeout=60)
    assert proc.returncode == 2
    assert one_line(proc) == f"tinct operator: kubeconfig {tmp_path / 'nope'}: no such file"
    port = free_port()
    kc = kubeconfig(tmp_path / "kc", dev=port)
    proc = tinct("operator", "--kubeconfig", str(kc), timeout=60)
    assert proc.returncode == 1
    assert one_line(proc).startswith(
        f"tinct operator: cannot reach the Kubernetes API server at https://127.0.0.1:{port}: connection refused"
    )


def test_the_router_watch_exits_on_a_kubeconfig_it_cannot_use(tmp_path: Path) -> None:
    proc = tinct("router", "--watch", "--kubeconfig", str(tmp_path / "nope"), "--port", str(free_port()))
    assert proc.returncode == 2
    assert one_line(proc) == f"tinct router: kubeconfig {tmp_path / 'nope'}: no such file"


def test_lineage_without_tables_names_the_root_and_how_to_pick_one(tmp_path: Path) -> None:
    proc = tinct("lineage", "sql", "SELECT * FROM model_versions", env={"TINCT_LINEAGE_ROOT": str(tmp_path)})
    assert proc.returncode == 1
    assert one_line(proc) == (
        f"tinct lineage sql: no lineage tables under {tmp_path}; set --root or TINCT_LINEAGE_ROOT to the "
        "operator's --lineage-root (with the Helm chart's PVC: kubectl exec -n <namespace> "
        "deploy/<release>-operator -- tinct lineage ...)"
    )


@pytest.fixture
def lineage(tmp_path: Path) -> Path:
    root = tmp_path / "lineage"
    store = LineageStore(str(root))
    for i in (1, 2):
        rows = lineage_event(i)["model_versions"]
        for fmt in ("onnx", "ptx", "safetensors", "source"):
            rows[0][f"{fmt}_sha256"] = f"{i:x}{fmt}".encode().hex().ljust(64, "0")
        store.merge("model_versions", rows)
    return root


def test_lineage_names_a_missing_table_and_the_ones_there(lineage: Path) -> None:
    proc = tinct("lineage", "sql", "SELECT * FROM releases", "--root", str(lineage))
    assert proc.returncode == 1
    assert one_line(proc) == (
        f"tinct lineage sql: no table releases under {lineage} (it has model_versions, artifacts, "
        "interfaces, adapters, release_events and the view model_lineage)"
    )


def test_time_travel_outside_the_history_is_refused_with_its_bounds(lineage: Path) -> None:
    proc = tinct(
        "lineage",
        "sql",
        "SELECT count(*) FROM model_versions",
        "--as-of-version",
        "57",
        "--root",
        str(lineage),
    )
    assert proc.returncode == 2
    assert one_line(proc) == (
        "tinct lineage sql: model_versions has versions 0 to 2; --as-of-version 57 is outside its history "
        "(a ModelVersion's status.lineage.version names a version it has)"
    )
    proc = tinct(
        "lineage",
        "sql",
        "SELECT count(*) FROM model_versions",
        "--as-of",
        "2020-01-01",
        "--root",
        str(lineage),
    )
    assert proc.returncode == 2
    assert one_line(proc).startswith(
        "tinct lineage sql: --as-of 2020-01-01T00:00:00+00:00 is before the lineage history, which begins at "
    )


def test_mistyped_sql_is_a_usage_error_said_in_a_sentence(lineage: Path) -> None:
    proc = tinct("lineage", "sql", "SELECT * FORM model_versions", "--root", str(lineage))
    assert proc.returncode == 2
    assert one_line(proc) == (
        "tinct lineage sql: the query does not parse: expected end of statement but found FORM "
        "(line 1, column 10)"
    )
    proc = tinct("lineage", "sql", "SELECT uid FROM model_versions WHERE", "--root", str(lineage))
    assert proc.returncode == 2
    assert one_line(proc) == (
        "tinct lineage sql: the query does not parse: expected an expression but found the end of the query"
    )
    proc = tinct("lineage", "sql", "SELECT 1", "--memory-limit", "lots", "--root", str(lineage))
    assert proc.returncode == 2
    assert "argument --memory-limit: 'lots' is not a size of at least 1Mi (e.g. 256Mi, 1Gi)" in proc.stderr


@pytest.fixture
def wide_lineage(tmp_path: Path) -> Path:
    """model_versions with 300 rows: a three-way cartesian product of it has 27 million."""
    root = tmp_path / "wide"
    rows = [row for i in range(300) for row in lineage_event(i)["model_versions"]]
    LineageStore(str(root)).merge("model_versions", rows)
    return root


def test_a_cartesian_product_ends_at_the_memory_limit_not_in_gigabytes(wide_lineage: Path) -> None:
    cartesian = (
        "SELECT a.uid, b.event_id, c.recorded_at FROM model_versions a, model_versions b, model_versions c"
    )
    for sql, said in (
        (
            f"{cartesian} ORDER BY a.uid, b.event_id, c.recorded_at",
            "tinct lineage sql: the query needs more than the memory limit of 64 MiB for its joins, sorts or "
            "aggregations (nothing spills to disk): filter or aggregate sooner, or raise --memory-limit",
        ),
        (
            cartesian,
            "tinct lineage sql: the answer is larger than the memory limit of 64 MiB: add a LIMIT, a filter "
            "or an aggregate, or raise --memory-limit",
        ),
    ):
        proc = subprocess.Popen(
            [*commands.TINCT, "lineage", "sql", sql, "--root", str(wide_lineage), "--memory-limit", "64Mi"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        watchdog = threading.Timer(300, proc.kill)  # a query that is not held is not waited for
        watchdog.start()
        _, status, usage = os.wait4(proc.pid, 0)  # the exit status and this process's peak memory
        watchdog.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read()
        proc.stderr.close()
        assert proc.returncode == 1, err
        assert err == said + "\n"
        # Unbounded, the sorted product passes 2.6 GB. Held at 64 MiB, the pool, a sort's
        # working copy of it and the answer stay within a few times the limit, besides the
        # interpreter and its libraries (~180 MiB): a small limit keeps the bound far from
        # gigabytes whatever the allocator and the scheduling do with the in-flight batches.
        assert usage.ru_maxrss * 1024 < 512 * 2**20, usage.ru_maxrss


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_endless_query_ends_at_its_timeout_or_at_ctrl_c(lineage: Path) -> None:
    endless = "SELECT sum(value) FROM generate_series(1, 1000000000000)"
    proc = tinct("lineage", "sql", endless, "--timeout", "2", "--root", str(lineage))
    assert proc.returncode == 1
    assert one_line(proc) == (
        "tinct lineage sql: the query ran longer than the timeout of 2 s and was stopped: add a filter or a "
        "LIMIT, or raise --timeout"
    )
    # As from a terminal: Ctrl-C at its default, whatever this process inherited or set (a
    # command started with SIGINT ignored keeps ignoring it, as every program does).
    with subprocess.Popen(
        [
            "env",
            "--default-signal=INT",
            *commands.TINCT,
            "lineage",
            "sql",
            endless,
            "--root",
            str(lineage),
            "--timeout",
            "3600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as running:
        # Starting up takes well under a second of CPU; past three the query is running.
        while _cpu_seconds(running.pid) < 3:
            assert running.poll() is None, running.communicate()
            time.sleep(0.1)
        running.send_signal(signal.SIGINT)
        try:
            out, err = running.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            running.kill()
            out, err = running.communicate()
            raise AssertionError(f"Ctrl-C did not end the query in 120 s: {err[-2000:]}") from None
    assert (running.returncode, out, err) == (130, "", "tinct lineage: interrupted\n")


def test_lineage_show_of_an_unknown_model_says_so_and_fails(lineage: Path) -> None:
    proc = tinct("lineage", "show", "UNKNOWN", "--root", str(lineage))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert one_line(proc) == (
        f"tinct lineage show: no recorded history of model 'UNKNOWN' under {lineage} "
        "(models recorded: model-1, model-2)"
    )


def test_lineage_show_fits_a_terminal_with_short_digests(lineage: Path) -> None:
    proc = tinct("lineage", "show", "model-1", "--root", str(lineage))
    assert proc.returncode == 0, proc.stderr
    width = max(len(line) for line in proc.stdout.splitlines())
    assert width <= 200, proc.stdout
    assert "onnx" in proc.stdout.splitlines()[0]
    whole = tinct("lineage", "show", "model-1", "--root", str(lineage), "--format", "json")
    assert len(yaml.safe_load(whole.stdout)[0]["onnx_sha256"]) == 64


def test_an_unexpected_error_is_one_line_with_the_way_to_the_traceback(tmp_path: Path) -> None:
    where = tmp_path / "file"
    where.write_text("a file, not a directory")
    proc = tinct("crds", "--out", str(where / "crds"))
    assert proc.returncode == 1
    assert one_line(proc) == (
        f"tinct crds: unexpected error: NotADirectoryError: [Errno 20] Not a directory: '{where / 'crds'}' "
        "(TINCT_DEBUG=1 shows the traceback)"
    )
    debug = tinct("crds", "--out", str(where / "crds"), env={"TINCT_DEBUG": "1"})
    assert "Traceback" in debug.stderr


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out.extend(_parsers(child))
    return out


def test_every_help_documents_the_exit_statuses() -> None:
    for parser in _parsers(build_parser()):
        text = parser.format_help()
        assert "exit status:" in text, parser.prog
        for code in EXIT_CODES:
            assert f"\n  {code} " in text, (parser.prog, code)


def test_the_operator_names_a_prometheus_that_does_not_answer(capsys: pytest.CaptureFixture[str]) -> None:
    from tinct.operator.cli import _check_prometheus
    from tinct.operator.settings import OperatorConfig

    port = free_port()
    config = OperatorConfig.from_env(
        {
            "TINCT_PROMETHEUS_URL": f"http://127.0.0.1:{port}",
            "TINCT_PROMETHEUS": f"edge=http://127.0.0.1:{port}/p",
        }
    )
    _check_prometheus(config)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" does not answer ")[0] for line in lines] == [
        f"tinct operator: Prometheus default at http://127.0.0.1:{port}",
        f"tinct operator: Prometheus edge at http://127.0.0.1:{port}/p",
    ]
    assert all(line.endswith("analyses reading it are inconclusive until it does") for line in lines)
