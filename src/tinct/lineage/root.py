"""Where the lineage tables live unless told otherwise; one default for every command.

Only the standard library is imported, so ``tinct --help`` stays fast.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_ROOT", "ENV", "lineage_root"]

#: Root of the lineage tables when neither a flag nor the environment names one.
DEFAULT_ROOT = "/var/lib/tinct/lineage"
#: The environment variable ``tinct operator`` and ``tinct lineage`` both read.
ENV = "TINCT_LINEAGE_ROOT"


def lineage_root(given: str | None = None) -> str:
    """``given`` (a flag), else ``$TINCT_LINEAGE_ROOT``, else :data:`DEFAULT_ROOT`.

    A ``file://`` URI becomes the plain directory path deltalake expects.
    """
    root = given or os.environ.get(ENV) or DEFAULT_ROOT
    return root[len("file://") :] if root.startswith("file://") else root
