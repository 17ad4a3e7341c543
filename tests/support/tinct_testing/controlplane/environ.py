"""Set environment variables for a block and put back what was there before."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def patched_environ(**values: str) -> Iterator[None]:
    """``os.environ`` updated with ``values`` inside the block; restored (or unset) after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["patched_environ"]
