"""``tinct release`` steering a release whose status the operator keeps writing."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tinct.release.cli import REQUEST_TRIES, _request


class _Release:
    """A GrayRelease on a stand-in API: each read sees the operator's latest status write, and a
    guarded patch conflicts while the operator writes faster than ``conflicts`` allows."""

    def __init__(self, conflicts: int, phase: str = "Progressing") -> None:
        self.phase = phase
        self.version = 7
        self.attempt = 1
        self.conflicts = conflicts
        self.patches: list[dict[str, Any]] = []

    def get_namespaced_custom_object(self, *_: Any) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "chat",
                "namespace": "llm",
                "resourceVersion": str(self.version),
                "annotations": {},
            },
            "status": {"attempt": self.attempt, "phase": self.phase},
        }

    def patch_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        body = args[-1]
        self.patches.append(body)
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1  # the operator wrote its status, and a retry was due: attempt 2
            self.attempt = 2
            raise ApiException(status=409, reason="Conflict")
        assert body["metadata"]["resourceVersion"] == str(self.version)
        return body


def test_a_request_is_written_again_on_the_version_the_operator_left(
    capsys: pytest.CaptureFixture[str],
) -> None:
    release = _Release(conflicts=2)
    assert _request(release, "llm", "chat", "abort", wait=0) == 0
    assert len(release.patches) == 3
    value = release.patches[-1]["metadata"]["annotations"]["tinct.io/action"]
    assert value.startswith("abort@a2-"), "the request names the attempt it read last"
    assert capsys.readouterr().out == f"grayrelease llm/chat: requested abort (tinct.io/action={value})\n"


def test_a_release_that_never_holds_still_is_a_conflict_said_once() -> None:
    release = _Release(conflicts=REQUEST_TRIES)
    with pytest.raises(ApiException) as conflict:
        _request(release, "llm", "chat", "promote", wait=0)
    assert conflict.value.status == 409
    assert len(release.patches) == REQUEST_TRIES


@pytest.mark.parametrize("verb", ["promote", "abort", "resume", "retry"])
def test_a_request_to_a_promoted_release_is_refused_in_one_line_and_not_written(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    release = _Release(conflicts=0, phase="Promoted")
    assert _request(release, "llm", "chat", verb, wait=0) == 1
    assert release.patches == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"tinct release: grayrelease llm/chat: {verb} refused: ")
