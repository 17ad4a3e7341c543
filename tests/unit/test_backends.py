"""Which backends a release may name: its namespace's Services, and the allow-list."""

from __future__ import annotations

import pytest

from tinct.api.backends import BackendPolicy, parse_allowed
from tinct.operator.grayrelease.world import View
from tinct.operator.settings import OperatorConfig
from tinct_testing.release_helpers import release

POLICY = BackendPolicy(parse_allowed("*.shared.svc.cluster.local, api.example.com, 10.20.0.0/16"))


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://sched-v1.llm.svc.cluster.local:8000", True),
        ("http://sched-v1.llm.svc:8000", True),
        ("http://pod-0.sched.llm.svc.cluster.local:8000", True),  # a headless Service's Pod
        ("http://SCHED-V1.LLM.SVC.CLUSTER.LOCAL.:8000", True),
        ("http://sched-v1.other.svc.cluster.local:8000", False),  # another namespace's Service
        ("http://llm.svc.cluster.local:8000", False),
        ("http://sched-v1:8000", False),  # bare: resolved in the router's namespace
        ("http://sched-v1.llm.svc.evil.example:8000", False),
        ("http://127.0.0.1:8000", False),
        ("http://127.1:8000", False),  # loopback spelled as a host name
        ("http://[::1]:8000", False),
        ("http://169.254.169.254:80", False),
        ("http://10.20.3.4:8000", True),
        ("http://10.21.3.4:8000", False),
        ("https://api.example.com", True),
        ("https://x.api.example.com", False),
        ("http://a.shared.svc.cluster.local:80", True),
        ("http://shared.svc.cluster.local:80", False),
    ],
)
def test_a_backend_is_the_releases_own_or_allowed(url: str, ok: bool) -> None:
    assert (POLICY.refusal(url, "llm") is None) is ok


def test_the_refusal_says_what_to_do() -> None:
    why = BackendPolicy().refusal("http://sched-v1.other.svc.cluster.local:8000", "llm")
    assert why is not None
    assert "a Service of namespace llm (<service>.llm.svc)" in why
    assert "--allow-backend" in why


def test_allowed_entries_are_checked() -> None:
    assert parse_allowed(["10.0.0.1", " *.Example.COM ", "", "10.0.0.1/32"]) == (
        "10.0.0.1/32",
        "*.example.com",
    )
    for bad in ("http://x", "*", "a..b", "-x.com", "x_y.com"):
        with pytest.raises(ValueError, match="neither a host name"):
            parse_allowed([bad])
    with pytest.raises(ValueError, match="TINCT_ALLOW_BACKENDS="):
        OperatorConfig.from_env({"TINCT_ALLOW_BACKENDS": "http://x"})
    assert OperatorConfig.from_env({"TINCT_ALLOW_BACKENDS": "127.0.0.1"}).backends.allowed == (
        "127.0.0.1/32",
    )


def _view(external: dict[str, str] | None = None) -> View:
    return View(
        modelversions={},
        services={"sched-v1": True, "sched-v2": True},
        service_ports={"sched-v1": (8000,), "sched-v2": (8000,)},
        deployments={},
        hpas=[],
        external=external or {},
    )


def test_a_release_naming_another_namespace_fails_and_an_external_name_is_held() -> None:
    gr = release()
    gr.spec.candidate.url = "http://sched-v1.other.svc.cluster.local:8000"
    (p,) = _view().backend_problems(gr, BackendPolicy())
    assert (p.condition, p.reason, p.side, p.fatal) == (
        "BackendsAvailable",
        "BackendNotAllowed",
        "candidate",
        True,
    )
    assert p.message.startswith("candidate backend spec.candidate.url: http://sched-v1.other.svc")
    # The same through an ExternalName Service of its own namespace: held until the Service changes.
    gr = release()
    (p,) = _view({"sched-v1": "sched-v1.other.svc.cluster.local"}).backend_problems(gr, BackendPolicy())
    assert (p.side, p.fatal) == ("stable", False)
    assert "Service sched-v1 (ExternalName)" in p.message
    assert _view({"sched-v1": "sched-v9.llm.svc.cluster.local"}).backend_problems(gr, BackendPolicy()) == []
    assert _view().backend_problems(release(), BackendPolicy()) == []
