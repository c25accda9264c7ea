"""Fixtures of the operator's unit tests (samples live in operator_samples.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from operator_samples import status_errors


@pytest.fixture
def validate_status() -> Callable[[dict[str, Any]], None]:
    def check(status: dict[str, Any]) -> None:
        errors = status_errors(status)
        assert errors == [], errors
    return check
