"""The on-disk cache of generated sources, keyed by the hash of their text.

Entries are written atomically (temp file + rename) and verified on load: the file's
content must hash to its name, so a truncated or corrupt entry is rebuilt, never
trusted. Triton keeps its own cache of compiled binaries beside it.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from kiln.config import config


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cache_path(kind: str, text: str, suffix: str = ".py") -> str:
    """Path of the verified cache file holding `text` (written if absent or corrupt)."""
    digest = source_hash(text)
    folder = os.path.join(config.cache_dir, kind, digest[:2])
    path = os.path.join(folder, f"k{digest}{suffix}")
    if os.path.exists(path):
        try:
            with open(path) as handle:
                if source_hash(handle.read()) == digest:
                    return path
        except OSError:
            pass
    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return path
