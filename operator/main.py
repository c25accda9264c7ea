"""Entry point of ``kafka-cleaner-operator``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    raise SystemExit("kafka-cleaner-operator: not built yet")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
