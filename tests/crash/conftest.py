"""The crash checker's scale: small logs in ``make test``, bigger ones in ``make crash-soak``."""

from __future__ import annotations

import os

SOAK = os.environ.get("CRASH_SOAK") == "1"
