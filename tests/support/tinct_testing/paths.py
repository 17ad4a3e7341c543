"""Where the checkout's files are: the tests read the CRDs, examples, chart and docs as shipped.

The package is installed editable from ``tests/support`` (``scripts/bootstrap.sh``), so its
files stay inside the checkout and the paths below are the checkout's own.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if not (ROOT / "pyproject.toml").is_file() or not (ROOT / "src" / "tinct").is_dir():
    raise ImportError(
        f"tinct_testing runs from a tinct checkout (installed with `pip install -e tests/support`); "
        f"{ROOT} is not one"
    )
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"
CHART = ROOT / "charts" / "tinct"
#: The CRDs tinct ships, by name.
CRD_NAMES = ("modelversions.tinct.io", "grayreleases.tinct.io")

__all__ = ["CHART", "CRDS", "CRD_NAMES", "EXAMPLES", "ROOT"]
