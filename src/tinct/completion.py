"""Shell completion for ``tinct`` and the ``kubectl tinct`` plugin: one engine, small shell glue.

:func:`complete` reads the parser ``tinct`` runs with (so a new command or flag completes
without anyone touching this module) and answers what may come at the cursor: commands,
flags, a flag's choices, and GrayRelease names and namespaces from the cluster the command
would talk to (best effort: a cluster that does not answer within a second completes nothing).
The shell scripts (:data:`SCRIPTS`, printed by ``tinct completion bash|zsh|fish``) hand the
words to ``tinct __complete`` and show what it prints, one candidate a line; kubectl runs
``kubectl_complete-tinct`` (:func:`tinct.plugin.kubectl_complete`) the same way for
``kubectl tinct <TAB>``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SCRIPTS", "complete"]

#: Completion scripts; each calls ``tinct __complete WORD...`` (the last word being completed).
SCRIPTS = {
    "bash": """# tinct completion for bash: source <(tinct completion bash)
_tinct_complete() {
    local IFS=$'\\n'
    COMPREPLY=($(compgen -W "$(tinct __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null)" -- "${COMP_WORDS[COMP_CWORD]}"))
}
complete -o default -F _tinct_complete tinct
""",
    "zsh": """#compdef tinct
# tinct completion for zsh: source <(tinct completion zsh)
_tinct() {
    local -a candidates
    candidates=("${(@f)$(tinct __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    compadd -- "${candidates[@]}"
}
compdef _tinct tinct
""",
    "fish": """# tinct completion for fish: tinct completion fish | source
complete -c tinct -f -a '(tinct __complete (commandline -opc)[2..-1] (commandline -ct) 2>/dev/null)'
""",
}

Lister = Callable[[str, str | None], list[str]]


def _cluster_names(what: str, namespace: str | None) -> list[str]:
    """GrayRelease (``grayreleases``) or namespace (``namespaces``) names, or nothing."""
    try:
        from kubernetes import client

        from tinct.kubeconfig import api_client, choose, namespace_of

        api = api_client()
        try:
            if what == "namespaces":
                found: Any = client.CoreV1Api(api).list_namespace(_request_timeout=1)
                return [str(n.metadata.name) for n in found.items]
            ns = namespace or namespace_of(choose())
            objs: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
                "tinct.io", "v1alpha1", ns, "grayreleases", _request_timeout=1
            )
            return [str(o["metadata"]["name"]) for o in objs.get("items") or []]
        finally:
            api.close()
    except Exception:  # completion never fails a shell
        return []


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def complete(
    words: Sequence[str], parser: argparse.ArgumentParser, names: Lister = _cluster_names
) -> list[str]:
    """Candidates for the last of ``words`` (the words after ``tinct``; the last may be empty)."""
    *done, current = list(words) or [""]
    positionals: list[str] = []
    namespace: str | None = None
    i = 0
    while i < len(done):
        word = done[i]
        sub = _subparsers(parser)
        if word in sub and not positionals:
            parser, positionals = sub[word], []
        elif word.startswith("-"):
            action = _flags(parser).get(word.split("=", 1)[0])
            if action is not None and action.nargs != 0 and "=" not in word:
                if action.dest == "namespace" and i + 1 < len(done):
                    namespace = done[i + 1]
                i += 1  # the flag's value
        else:
            positionals.append(word)
        i += 1
    if done and done[-1].startswith("-"):
        action = _flags(parser).get(done[-1])
        if action is not None and action.nargs != 0:
            if action.choices:
                return [str(c) for c in action.choices if str(c).startswith(current)]
            if action.dest == "namespace":
                return [n for n in names("namespaces", None) if n.startswith(current)]
            if action.dest == "kubeconfig":
                return []  # a file: the shell's own completion
            return []
    if current.startswith("-"):
        return sorted(f for f in _flags(parser) if f.startswith(current) and f.startswith("--"))
    sub = _subparsers(parser)
    if sub and not positionals:
        return [c for c in sub if c.startswith(current) and not c.startswith("__")]
    wanted = [a for a in parser._actions if not a.option_strings and a.dest != "help"]
    if len(positionals) < len(wanted):
        action = wanted[len(positionals)]
        if action.choices:
            return [str(c) for c in action.choices if str(c).startswith(current)]
        if action.dest == "name" and parser.prog.endswith("release"):
            return [n for n in names("grayreleases", namespace) if n.startswith(current)]
    return []
