"""Fixtures of the sidecar tests (helpers live in ``sidecar_helpers``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sidecar_helpers import NOW_MS

from cleaner.generate import GeneratorConfig, generate


@pytest.fixture
def make_log_dir(tmp_path: Path) -> Callable[..., Path]:
    """``make_log_dir(name, **GeneratorConfig options)``: a generated broker log dir (small
    segments, the generator's clock at ``NOW_MS``)."""

    def make(name: str = "kafka-logs", **options: object) -> Path:
        config = {"topics": 2, "partitions": 2, "records": 3_000, "keys": 300, "segment_bytes": 32 * 1024}
        config.update(options)
        path = tmp_path / name
        generate(path, GeneratorConfig(now_ms=NOW_MS, **config))  # type: ignore[arg-type]
        return path

    return make
