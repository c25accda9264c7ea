"""What the embedded session's set-up leaves on the driver's machine: the quiet log4j2
configuration lives in a temporary directory for the driver's life, is removed when the driver
exits, and is not made at all when the user has a ``SPARK_CONF_DIR`` of their own.

Each case runs in a fresh interpreter (the set-up changes the process's environment) with its
own ``TMPDIR``; no JVM is started: the JVM reads the directory once, at its launch, so what
matters here is only when the directory exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DRIVER = """\
import json, os
from cleaner.spark import session
session.use_quiet_log_configuration()
conf = os.environ["SPARK_CONF_DIR"]
print(json.dumps({"conf": conf, "quiet": os.path.isfile(os.path.join(conf, "log4j2.properties"))}))
"""


def run_driver(tmp_path: Path, *, conf_dir: str | None) -> dict[str, Any]:
    """The driver's ``SPARK_CONF_DIR`` and whether the quiet configuration was in it, while it ran."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    env["TMPDIR"] = str(tmp_path)
    if conf_dir is not None:
        env["SPARK_CONF_DIR"] = conf_dir
    out = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_the_quiet_log_configuration_is_removed_when_the_driver_exits(tmp_path: Path) -> None:
    seen = run_driver(tmp_path, conf_dir=None)
    assert seen["quiet"] and Path(seen["conf"]).parent == tmp_path, seen
    assert list(tmp_path.iterdir()) == [], "the driver left its log configuration behind"


def test_a_users_spark_conf_dir_is_kept_and_nothing_is_made(tmp_path: Path) -> None:
    mine = tmp_path / "my-spark-conf"
    mine.mkdir()
    assert run_driver(tmp_path, conf_dir=str(mine)) == {"conf": str(mine), "quiet": False}
    assert list(tmp_path.iterdir()) == [mine]
