"""``kubectl tinct``: the kubectl plugin, an installed ``kubectl-tinct`` on PATH.

``kubectl tinct status chat --watch`` runs ``tinct release status chat --watch``: a first
word that is a ``tinct release`` verb (status, list, pause, resume, promote, abort, retry)
is a release command; ``kubectl tinct release ...`` and every other ``tinct`` command
(``kubectl tinct version``, ``kubectl tinct lineage sql ...``) run as ``tinct`` would. kubectl
hands a plugin every word after its name, flags included, so ``-n``, ``--context`` and
``--kubeconfig`` reach it unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tinct.release.cli import RELEASE_VERBS

__all__ = ["RELEASE_VERBS", "main", "plugin_argv"]

#: Flags of ``tinct release`` that take a value, which may come before the verb.
_VALUED = ("-n", "--namespace", "--context", "--kubeconfig", "-o", "--output", "--color", "--wait")


def plugin_argv(words: Sequence[str]) -> list[str]:
    """The ``tinct`` arguments ``kubectl tinct WORDS`` stand for."""
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in _VALUED else 1
    if i < len(words) and words[i] in RELEASE_VERBS:
        return ["release", *words]
    return list(words)


def main(argv: Sequence[str] | None = None) -> int:
    from tinct.cli import main as tinct_main

    return tinct_main(plugin_argv(sys.argv[1:] if argv is None else argv), prog="kubectl tinct")
