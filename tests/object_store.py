"""A real S3-compatible object store on loopback for the tests.

``s3server`` (tests/objectstore) is gofakes3 with its files backend: each object a file under
the store's directory, so the objects of a test are not held in memory. It is built from Go
modules by ``scripts/get-objectstore.sh`` (``make setup``) into ``.tools/objectstore``; the
requests are S3's REST API, which boto3 and the cleaner's jobs send as they would to S3.

Where it differs from S3 (the server's comments say which it corrects, and how):

- a key with an empty, "." or ".." part ("dir/", "a//b") is refused (400 InvalidArgument), and
  "a" and "a/b" cannot both exist (a file and a directory; 500 InternalError);
- a listing without keys has no ``KeyCount`` (read ``page.get("Contents", [])``);
- HEAD, GET and listings give an object a multipart upload wrote its MD5 as ETag, not S3's
  "<md5 of the parts' MD5s>-<parts>" (the completion's answer has that one);
- a PUT over an object keeps the old user metadata and Content-Type it does not set itself;
- no x-amz-checksum-* is kept or returned (boto3 then checks none);
- user metadata names come back in HTTP's canonical case ("Mtime"; S3 answers "mtime");
- a PUT that fails part-way leaves no object (S3 keeps the one it would have replaced), and an
  overwrite is not atomic for a reader of the object at that moment;
- a multipart upload's parts are held in the server's memory until it is completed.

    with running_object_store(tmp_path) as store:
        s3 = store.client()                      # this process
        subprocess.run(..., env={**os.environ, **store.env()})  # a plain boto3.client("s3") there
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: The current build (get-objectstore.sh points ``current`` at the digest of its inputs).
BINARY = REPO / ".tools" / "objectstore" / "current" / "bin" / "s3server"
LISTENING = "s3server listening on "
STARTUP_TIMEOUT_S = 30.0


def missing_reason() -> str:
    return (f"the object store is not built: no {BINARY} "
            "(make setup builds it; alone: ./scripts/get-objectstore.sh)")  # fmt: skip


@dataclass(frozen=True)
class ObjectStore:
    """Where a running store is and how to sign for it (gofakes3 checks no credentials, but
    boto3 signs every request and needs some)."""

    endpoint_url: str
    root: Path
    access_key: str = "kafka-cleaner-tests"
    secret_key: str = "kafka-cleaner-tests-secret"
    region: str = "us-east-1"

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client of this store, path-style (``http://host:port/bucket/key``: no
        DNS name per bucket on loopback). ``config``: more botocore ``Config`` settings."""
        # boto3 comes with the spark extra; conftest.py imports this module for every test.
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    def upload_log_dir(self, local: Path, uri: str, threads: int = 8) -> None:
        """A local log dir copied to ``s3://bucket/prefix`` as rclone copies one: every file an
        object, its mtime in the ``mtime`` metadata (``cleaner.spark.object_store``), several
        PUTs at once (a fleet is hundreds of small files)."""
        from cleaner.spark.object_store import MTIME_METADATA, ObjectLogDir, mtime_text

        log_dir, client = ObjectLogDir.parse(uri), self.client()

        def put(path: Path) -> None:
            client.put_object(Bucket=log_dir.bucket, Key=log_dir.key(path.relative_to(local).as_posix()),
                              Body=path.read_bytes(), Metadata={MTIME_METADATA: mtime_text(path.stat().st_mtime_ns)})

        todo = [p for p in sorted(local.rglob("*")) if p.is_file() and p.name != ".lock"]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(put, todo))

    def download_log_dir(self, uri: str, local: Path) -> Path:
        """Every object of a log dir in the store onto ``local``, as ``rclone copy`` brings one
        back to a broker's disk (each file's time from its ``mtime`` metadata). Read by the
        jobs' own reader, which finds the store in the environment: set ``env()`` first."""
        from cleaner.spark.object_store import ObjectLogDir, download

        log_dir = ObjectLogDir.parse(uri)
        root, partitions = log_dir.layout()
        for o in root + [o for listed in partitions.values() for o in listed]:
            download(log_dir, o, local / o.name)
        return local

    def env(self) -> dict[str, str]:
        """The variables that make a plain ``boto3.client("s3")`` of another process use this
        store (botocore addresses an IP endpoint path-style by itself). Lay them over an
        environment without ``AWS_ENDPOINT_URL_S3`` or ``AWS_PROFILE``, which would win."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }


def _output(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no output)"


@contextlib.contextmanager
def running_object_store(root: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[ObjectStore]:
    """An ``s3server`` storing under ``root/data`` (its output in ``root/s3server.log``), from
    the moment it accepts connections until the block ends.

    It binds port 0 and reports the port the kernel chose: bound by the server itself, the
    port has no window in which another process can take it, and a port from the ephemeral
    range is never one that ports.free_port hands another test's server."""
    if not BINARY.is_file():
        raise RuntimeError(missing_reason())
    root.mkdir(parents=True, exist_ok=True)
    data, log = root / "data", root / "s3server.log"
    with open(log, "wb") as out:  # a fresh log: an earlier run's line names another port
        proc = subprocess.Popen(
            [str(BINARY), "-addr", "127.0.0.1:0", "-root", str(data)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        endpoint = _wait_listening(proc, log, timeout_s)
        yield ObjectStore(endpoint_url=endpoint, root=data)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_listening(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> str:
    """The endpoint URL from the server's "listening" line, printed once it is bound."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        for line in text.split("\n")[:-1]:  # whole lines only: the last may be half written
            if line.startswith(LISTENING):
                return line.removeprefix(LISTENING)
        if proc.poll() is not None:
            raise RuntimeError(f"s3server exited with {proc.returncode} before listening:\n{_output(log)}")
        time.sleep(0.02)
    raise RuntimeError(
        f"s3server did not print {LISTENING!r}<url> within {timeout_s} s ({BINARY}); its output:\n{_output(log)}"
    )
