"""The image, without a Docker engine: the Dockerfile's build steps run as they are written (its
COPY lines, then its RUN line through ``sh``, with ``/wheels`` and ``/opt/kafka-cleaner`` mapped
to temporary directories), so the wheel is built and installed into a fresh venv exactly the way
the image gets it, with the same pip command and requirements. Then, with the runtime stage's
environment and working directory:

* both entry points answer ``--help`` (``ENTRYPOINT`` + ``CMD``, and the operator's);
* the sidecar, started with the command line the operator injects, serves a ``/status`` over a
  generated broker log dir that the v1 schema and the operator both accept, and exits 0 on
  SIGTERM;
* nothing is written into the venv at run time (the pod's root filesystem is read-only).

Not checked here: the numeric ``USER`` (the interpreter of this machine lives under ``/root``,
which no other user may enter; tests/operator/test_dockerfile.py checks the instruction).

Slow (a venv and about 50 packages: about a minute here, two on a busy 2-core machine); pip's
own cache is used (the Dockerfile's ``PIP_NO_CACHE_DIR`` is not applied here), and so is the
compiled core's: ``native/target`` is copied with ``native/`` (``.dockerignore`` leaves it out
of the image's context), so cargo checks the crates built by ``make setup`` and links the core
instead of compiling liblz4, libzstd and every crate again. One test, since
building is most of its time (and pytest-xdist's ``xdist_group`` does not group tests under
pytest 9, so fixtures shared by several tests would be built once per worker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import jsonschema
import pytest
from compaction_operator.handlers import policy_file
from compaction_operator.injection import POLICY_DIR, build_sidecar
from compaction_operator.status import parse_report
from ports import free_port

from cleaner.config import parse_policy
from cleaner.generate import GeneratorConfig, generate

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text()
SCHEMA = json.loads((REPO / "docs" / "sidecar-status-v1.schema.json").read_text())
#: The PATH of the python base image, which the runtime stage's ENV prepends the venv to.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The builder's ENV that this test leaves out: pip's cache is what keeps it fast, and the
#: Rust toolchain the image copies from the official rust image is, here, the machine's own.
NOT_APPLIED = {"PIP_NO_CACHE_DIR", "CARGO_HOME", "RUSTUP_HOME", "PATH"}
#: The image's paths, and the directory names they get under the test's root.
IMAGE_PATHS = {"/opt/kafka-cleaner": "venv", "/wheels": "wheels", "/src": "src"}


# -------------------------------------------------------------------------------------------
# Reading the Dockerfile
# -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Stage:
    name: str
    instructions: list[tuple[str, str]]

    def all(self, op: str) -> list[str]:
        return [args for o, args in self.instructions if o == op]

    def one(self, op: str) -> str:
        [args] = self.all(op)
        return args

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                out[key] = value
        return out


def stages(text: str = DOCKERFILE) -> dict[str, Stage]:
    """The Dockerfile's stages by name (comments dropped, continuation lines joined)."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out: dict[str, Stage] = {}
    current: Stage | None = None
    for line in (raw.strip() for raw in joined.splitlines()):
        if not line:
            continue
        op, _, args = line.partition(" ")
        op, args = op.upper(), args.strip()
        if op == "FROM":
            name = args.split()[-1]
            current = out[name] = Stage(name, [])
        elif current is not None:
            current.instructions.append((op, args))
    return out


def map_paths(text: str, root: pathlib.Path) -> str:
    for image_path, local in IMAGE_PATHS.items():
        text = re.sub(rf"(?<![\w/.-]){re.escape(image_path)}(?=[/\s\"']|$)", str(root / local), text)
    return text


# -------------------------------------------------------------------------------------------
# Building "the image"
# -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Image:
    root: pathlib.Path
    venv: pathlib.Path
    env: dict[str, str]

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """``argv`` in the runtime stage's environment and working directory."""
        return subprocess.run(argv, env=self.env, cwd="/", capture_output=True, text=True, timeout=120)

    def which(self, command: str) -> str:
        found = shutil.which(command, path=self.env["PATH"])
        assert found is not None and pathlib.Path(found).parent == self.venv / "bin", (command, found)
        return found


def _copy_context(builder: Stage, src: pathlib.Path) -> None:
    """The builder's COPY lines (from the build context, the repository), with .dockerignore's
    exclusions of bytecode (not of ``native/target``: the compiled crates are this test's cache)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.pyd")
    for args in builder.all("COPY"):
        if args.startswith("--from="):
            continue  # the Rust toolchain from another stage: the machine's rustup here
        *sources, dest = shlex.split(args)
        assert not any(s.startswith("--") for s in sources), args
        target = src / dest
        for source in sources:
            path = REPO / source
            if path.is_dir():
                shutil.copytree(path, target if len(sources) == 1 and not dest.endswith("/")
                                else target / path.name, ignore=ignore)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)


def build_image(root: pathlib.Path) -> Image:
    """The builder stage run under ``root``, and the runtime stage's environment (the venv on PATH)."""
    built = stages()
    builder, runtime = built["builder"], built["runtime"]
    assert builder.one("WORKDIR") == "/src"
    src = root / IMAGE_PATHS["/src"]
    src.mkdir()
    _copy_context(builder, src)
    # `python` of the base image: this interpreter (which has pip and venv).
    bin_dir = root / "base-bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    # Nothing of this process's Python environment (make exports PYTHONSAFEPATH): only the ENV
    # of the Dockerfile, as in a real build.
    inherited = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    env |= {k: v for k, v in builder.env().items() if k not in NOT_APPLIED}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', BASE_PATH)}"
    # The first RUN installs the linker with apt-get (the machine has one); the last builds.
    toolchain, run = builder.all("RUN")
    assert toolchain.startswith("apt-get update") and "gcc" in toolchain, toolchain
    result = subprocess.run(["sh", "-c", map_paths(run, root)], cwd=src, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"the builder's RUN failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert len(list((root / IMAGE_PATHS["/wheels"]).glob("kafka_cleaner-*.whl"))) == 1

    runtime_env = {"LANG": "C.UTF-8"}  # the python base image's
    for key, value in runtime.env().items():
        runtime_env[key] = map_paths(value, root).replace("$PATH", BASE_PATH)
    assert runtime.one("WORKDIR") == "/"
    return Image(root, root / IMAGE_PATHS["/opt/kafka-cleaner"], runtime_env)


def files_of(root: pathlib.Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() or p.is_symlink()}


# -------------------------------------------------------------------------------------------
# The test (one: building the image is most of its time)
# -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_image_builds_and_runs(tmp_path: pathlib.Path) -> None:
    image = build_image(tmp_path)
    try:
        check_entry_points(image)
        check_sidecar(image)
    finally:
        shutil.rmtree(image.venv, ignore_errors=True)  # 300 MB: not kept in pytest's tmp dir history


def check_entry_points(image: Image) -> None:
    """``ENTRYPOINT`` + ``CMD``, the sidecar's and the operator's ``--help``; nothing written."""
    before = files_of(image.venv)
    entrypoint = json.loads(stages()["runtime"].one("ENTRYPOINT"))
    cmd = json.loads(stages()["runtime"].one("CMD"))
    assert entrypoint == ["kafka-cleaner"] and cmd == ["--help"]
    default = image.run([image.which(entrypoint[0]), *cmd])
    assert default.returncode == 0, default.stderr
    assert default.stdout.startswith("Usage: kafka-cleaner") and "sidecar" in default.stdout
    sidecar = image.run([image.which("kafka-cleaner"), "sidecar", "--help"])
    assert sidecar.returncode == 0 and "--log-dir" in sidecar.stdout, sidecar.stderr
    operator = image.run([image.which("kafka-cleaner-operator"), "--help"])
    assert operator.returncode == 0, operator.stderr
    assert "KAFKA_CLEANER_WATCH_NAMESPACES" in operator.stdout
    assert files_of(image.venv) == before, "the entry points wrote into the image"


def check_sidecar(image: Image) -> None:
    """The container the operator injects, run from the image: a /status both the schema and
    the operator accept, and exit status 0 on SIGTERM."""
    port = free_port()
    mount = "/var/lib/kafka"
    policy = parse_policy({
        "apiVersion": "kafkacleaner.io/v1alpha1", "kind": "CompactionPolicy",
        "metadata": {"name": "offsets", "namespace": "kafka", "generation": 7},
        "spec": {"topics": [{"match": "topic-.*", "cleanupPolicy": "compact"}],
                 "target": {"statefulSet": "kafka", "dataVolume": "data", "mountPath": mount,
                            "logDirs": ["kafka-log*"]},
                 "sidecar": {"port": port}, "reporting": {"intervalSeconds": 1}}})
    container = build_sidecar(policy, image="kafka-cleaner:test", native=True).container
    data, policy_dir = image.root / "data", image.root / "policy"
    generate(data / "kafka-log0", GeneratorConfig(topics=2, partitions=2, records=1000, keys=100,
                                                  segment_bytes=64 * 1024))
    policy_dir.mkdir()
    (policy_dir / "policy.yaml").write_text(policy_file(policy))
    data_before, venv_before = files_of(data), files_of(image.venv)

    def local(arg: str) -> str:
        arg = arg.replace("$(POD_NAME)", "kafka-0").replace(f"0.0.0.0:{port}", f"127.0.0.1:{port}")
        return arg.replace(POLICY_DIR, str(policy_dir)).replace(mount, str(data))

    argv = [image.which(container["command"][0]), *map(local, container["args"])]
    log = image.root / "sidecar.log"
    with log.open("w") as out:
        process = subprocess.Popen(argv, env=image.env | {"POD_NAME": "kafka-0", "POD_NAMESPACE": "kafka"},
                                   cwd="/", stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, doc = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
                    body = response.read()
                    doc = json.loads(body)
                if doc["scannedAt"] is not None:
                    break
            time.sleep(0.2)
        assert doc is not None and doc["scannedAt"] is not None, f"no scan within 60 s:\n{log.read_text()}"
        jsonschema.validate(doc, SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        assert parse_report(body, "kafka-0").error is None
        assert doc["broker"] == "kafka-0" and doc["policyGeneration"] == 7 and doc["mode"] == "observe"
        assert [d["path"] for d in doc["logDirs"]] == [str(data / "kafka-log0")]
        assert doc["logDirs"][0]["partitions"] == 4 and len(doc["partitions"]) == 4
        assert doc["errors"] == [], doc["errors"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert "Traceback" not in log.read_text(), log.read_text()
    assert files_of(data) == data_before, "observe mode wrote into the log dir"
    assert files_of(image.venv) == venv_before, "the sidecar wrote into the image"
