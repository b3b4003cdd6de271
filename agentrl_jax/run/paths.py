"""Run directories given as local paths or as URLs (``gs://bucket/run``).

Orbax reads and writes ``gs://`` (and other registered) URLs itself, so a checkpoint directory on
a bucket works as long as nothing rewrites it as a local path: ``os.path.abspath("gs://b/run")``
is ``$PWD/gs:/b/run``. :func:`absolute` makes local paths absolute and leaves URLs as given.
"""

from __future__ import annotations

import os
import re

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL (``scheme://...``: gs://, s3://, hdfs://) rather than a local
    path."""
    return bool(_URL.match(os.fspath(path)))


def absolute(path: str | os.PathLike) -> str:
    """``path`` made absolute if it is local; a URL unchanged."""
    path = os.fspath(path)
    return path if is_url(path) else os.path.abspath(path)


__all__ = ["absolute", "is_url"]
