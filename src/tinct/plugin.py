"""``kubectl tinct``: the kubectl plugin, an installed ``kubectl-tinct`` on PATH.

``kubectl tinct status chat --watch`` runs ``tinct release status chat --watch``: a first
word that is a ``tinct release`` verb (status, list, pause, resume, promote, abort, retry)
is a release command; ``kubectl tinct release ...`` and every other ``tinct`` command
(``kubectl tinct version``, ``kubectl tinct lineage sql ...``) run as ``tinct`` would. kubectl
hands a plugin every word after its name, flags included, so ``-n``, ``--context`` and
``--kubeconfig`` reach it unchanged.

kubectl completes a plugin by running ``kubectl_complete-<name>``: :func:`kubectl_complete`
answers for ``kubectl tinct WORDS<TAB>`` with the engine of :mod:`tinct.completion`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tinct.cli import build_parser
from tinct.cli import main as tinct_main
from tinct.completion import complete
from tinct.release.cli import RELEASE_VERBS

__all__ = ["RELEASE_VERBS", "kubectl_complete", "main", "plugin_argv"]

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
    """``kubectl-tinct``: run ``tinct`` with the arguments ``kubectl tinct WORDS`` stand for."""
    return tinct_main(plugin_argv(sys.argv[1:] if argv is None else argv), prog="kubectl tinct")


def kubectl_complete(argv: Sequence[str] | None = None) -> int:
    """``kubectl_complete-tinct``: what ``kubectl tinct WORDS<TAB>`` may complete, a line each."""
    words = list(sys.argv[1:] if argv is None else argv) or [""]
    parser = build_parser()
    if len(words) == 1:  # the first word: a release verb, or any tinct command
        found = [v for v in RELEASE_VERBS if v.startswith(words[0])] + complete(words, parser)
    else:
        found = complete(plugin_argv(words[:-1]) + words[-1:], parser)
    for candidate in dict.fromkeys(found):
        print(candidate)
    return 0
