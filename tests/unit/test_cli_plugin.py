"""`kubectl tinct`, `tinct version` and shell completion, as a shell runs them."""

from __future__ import annotations

import pytest

from tinct.cli import build_parser
from tinct.completion import complete
from tinct.plugin import plugin_argv


def _names(what: str, namespace: str | None) -> list[str]:
    return {"grayreleases": ["chat", "chat-2", "code"], "namespaces": ["llm", "tinct"]}[what]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (
            [""],
            [
                "crds",
                "router",
                "operator",
                "lineage",
                "release",
                "comparer",
                "emulator",
                "version",
                "completion",
            ],
        ),
        (["rel"], ["release"]),
        (["release", ""], ["status", "list", "pause", "resume", "promote", "abort", "retry"]),
        (["release", "status", "ch"], ["chat", "chat-2"]),
        (["release", "status", "-n", "llm", "c"], ["chat", "chat-2", "code"]),
        (["release", "status", "-n", ""], ["llm", "tinct"]),
        (["release", "status", "chat", "-o", ""], ["text", "json", "yaml"]),
        (["release", "status", "chat", "--wa"], ["--wait", "--watch"]),
        (["release", "status", "chat", ""], []),
        (["lineage", ""], ["sql", "show", "diff"]),
        (["completion", ""], ["bash", "zsh", "fish"]),
    ],
)
def test_completion_follows_the_parser(words: list[str], expected: list[str]) -> None:
    assert complete(words, build_parser(), names=_names) == expected


def test_kubectl_tinct_maps_release_verbs_and_passes_the_rest() -> None:
    assert plugin_argv(["status", "chat", "--watch"]) == ["release", "status", "chat", "--watch"]
    assert plugin_argv(["-n", "llm", "list"]) == ["release", "-n", "llm", "list"]
    assert plugin_argv(["release", "status", "chat"]) == ["release", "status", "chat"]
    assert plugin_argv(["lineage", "sql", "SELECT 1"]) == ["lineage", "sql", "SELECT 1"]
    assert plugin_argv(["version"]) == ["version"]
