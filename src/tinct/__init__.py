"""tinct: ML model version lineage and per-dye-cell gray release on Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tinct")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
