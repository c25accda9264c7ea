"""The Dockerfile's promises that can be checked by reading it (tests/test_image.py runs its build
steps and the result): a multi-stage build from the wheel, a numeric non-root user, exec-form
entry points, and a build context with just what the wheel needs."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from operator_samples import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]


def test_multi_stage_from_python_3_11_slim() -> None:
    steps = instructions()
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in steps
    stages = [args for op, args in steps if op == "FROM"]
    assert ("ARG", "RUST_IMAGE=rust:1-slim-bookworm") in steps
    assert stages == ["${RUST_IMAGE} AS rust", "${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE} AS runtime"]
    builder = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][1] :]
    assert ("COPY", "--from=rust /usr/local/cargo /usr/local/cargo") in builder
    build = " ".join(args for op, args in steps if op == "RUN")
    assert "pip wheel --no-deps" in build and "python -m venv /opt/kafka-cleaner" in build
    runtime = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][2] :]
    assert ("COPY", "--from=builder /opt/kafka-cleaner /opt/kafka-cleaner") in runtime
    assert not [args for op, args in runtime if op == "RUN"], "the runtime stage runs no shell"
    assert not [args for op, args in runtime if "rust" in args or "cargo" in args], "no compiler at run time"


def test_runs_as_a_numeric_non_root_user_with_exec_form_entry_points() -> None:
    steps = instructions()
    users = [args for op, args in steps if op == "USER"]
    assert users == ["65532:65532"]
    entrypoint = json.loads(next(args for op, args in steps if op == "ENTRYPOINT"))
    assert entrypoint == ["kafka-cleaner"]
    json.loads(next(args for op, args in steps if op == "CMD"))


def test_both_entry_points_are_console_scripts() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kafka-cleaner"] == "cleaner.cli:main"
    assert scripts["kafka-cleaner-operator"] == "compaction_operator.main:main"
    assert "kafka-cleaner --help" in DOCKERFILE and "kafka-cleaner-operator --help" in DOCKERFILE


def test_the_build_context_is_an_allowlist() -> None:
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!cleaner/", "!operator/", "!native/", "native/target"} <= set(lines)
    copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", DOCKERFILE, re.MULTILINE)
    assert copied == ["pyproject.toml README.md", "cleaner", "operator", "native"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[(]", r.strip(), maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def _third_party_imports(sources: Iterable[Path]) -> set[str]:
    """Distribution names of every non-standard-library module the sources import (function-level
    imports included: they fail just as hard, only later)."""
    modules: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    ours = {"cleaner", "compaction_operator"}
    distributions = importlib.metadata.packages_distributions()
    third_party = modules - set(sys.stdlib_module_names) - ours
    return {dist.lower().replace("_", "-") for module in third_party for dist in distributions.get(module, [module])}


def test_every_import_is_a_declared_requirement() -> None:
    """The wheel must pull in what the code imports: a missing one shows up only in a pod, at run
    time. cleaner/spark may also use the ``spark`` extra, which is installed only for Spark jobs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"])
    spark = REPO / "cleaner" / "spark"
    sources = [*(REPO / "cleaner").rglob("*.py"), *(REPO / "operator").rglob("*.py")]
    core = _third_party_imports(s for s in sources if spark not in s.parents)
    assert core <= declared, f"imported but not in [project] dependencies: {sorted(core - declared)}"
    spark_imports = _third_party_imports(spark.rglob("*.py"))
    assert spark_imports <= declared | _names(project["optional-dependencies"]["spark"])


def test_the_image_installs_the_wheel_and_nothing_else() -> None:
    """Everything the image needs comes from the wheel's own requirements, so that ``pip install
    kafka-cleaner`` gives a working operator too (tests/test_image.py runs the install line)."""
    install = next(step for step in re.sub(r"\\\n", " ", DOCKERFILE).split("&&") if "pip install " in step)
    words = shlex.split(install)
    beside = [w for w in words[words.index("install") + 1:] if not w.startswith("-") and not w.endswith(".whl")]
    assert beside == [], f"installed beside the wheel: {beside}"


def test_make_image_builds_with_the_builder_on_path_and_says_when_there_is_none(tmp_path: Path) -> None:
    """``make image`` runs the first of docker, buildah, podman found (here a recording
    ``docker`` first on PATH that prints its arguments), and fails clearly without any."""
    make = shutil.which("make")
    assert make is not None
    bare = subprocess.run(
        [make, "-s", "image"], cwd=REPO, env={"PATH": str(tmp_path)}, capture_output=True, text=True, check=False
    )
    assert bare.returncode != 0 and "make image: no docker, buildah or podman on PATH" in bare.stderr
    builder = tmp_path / "docker"
    builder.write_text('#!/bin/sh\necho "docker $*"\n')
    builder.chmod(0o755)
    built = subprocess.run(
        [make, "-s", "image", "IMAGE=registry.example/kafka-cleaner:1.2"],
        cwd=REPO,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0 and built.stdout.strip() == "docker build -t registry.example/kafka-cleaner:1.2 ."
