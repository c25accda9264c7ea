"""Log dir patterns: ``--log-dir`` may hold shell wildcards (Strimzi names a broker's log
dir ``kafka-log<node id>``), expanded on every scan because the broker may create the
directory after the sidecar starts."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path


def has_magic(pattern: str) -> bool:
    return glob.has_magic(pattern)


def expand_log_dirs(patterns: Sequence[str]) -> tuple[list[Path], list[str]]:
    """(existing log dirs, in pattern order then name order, without duplicates; patterns
    that match no directory yet)."""
    found: list[Path] = []
    seen: set[Path] = set()
    missing: list[str] = []
    for pattern in patterns:
        if has_magic(pattern):
            matches = [Path(p) for p in sorted(glob.glob(pattern)) if Path(p).is_dir()]
        else:
            matches = [Path(pattern)] if Path(pattern).is_dir() else []
        if not matches:
            missing.append(pattern)
        for m in matches:
            resolved = m.absolute()
            if resolved not in seen:
                seen.add(resolved)
                found.append(resolved)
    return found, missing
