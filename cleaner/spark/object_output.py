"""``compact --output s3://bucket/prefix``: the cleaned log dirs written to S3-compatible object
storage, laid out as the inputs are read (``<output>/<log dir name>/`` holding the root files
and ``<topic>-<partition>/`` prefixes, each file an object with its time in the ``mtime``
metadata, as ``rclone copy`` writes a directory), so the output is an INPUT of ``report`` and
``compact`` again, and ``rclone copy`` brings a log dir back to a broker's disk.

Object storage has no rename: a partition cannot appear whole at once. What stands in for the
file-system commit is Hadoop's convention, the ``_SUCCESS`` object an output committer writes
last (Spark's S3A committers write it as a JSON manifest of the files too):

1. The driver removes ``<output>/_SUCCESS`` before any task runs: from then on, until the
   commit, nobody reading the output takes it as whole.
2. Each task cleans its partition on the executor's local disk and uploads it over
   ``<output>/<log dir>/<partition>/``, then removes the objects of that prefix it did not
   write (an earlier output's segments), so the prefix holds the directory as a renamed
   directory would. A retried or speculative attempt uploads the same bytes (the clean is
   deterministic under the job's fixed clock).
3. After the job, the driver uploads each output log dir's root files (its
   ``cleaner-offset-checkpoint`` updated) and then writes ``_SUCCESS``: the run's id and every
   object of the run with its size and ETag.

A job killed anywhere leaves no ``_SUCCESS`` (or the previous one removed): the output is
partial and says so; a rerun of the same plan finishes it. ``_SUCCESS`` is not in any log dir,
so a broker given a log dir never sees it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cleaner.errors import KafkaCleanerError

from . import object_store
from .object_store import MTIME_METADATA, ObjectInfo, ObjectLogDir, fingerprint, mtime_text, s3_client

SUCCESS = "_SUCCESS"


def output_log_dir(output: ObjectLogDir, key: str) -> ObjectLogDir:
    """``<output>/<key>``: the output log dir of the input whose name under --output is ``key``."""
    return ObjectLogDir.parse(f"{output.uri}/{key}")


def upload_files(target: ObjectLogDir, local: Path, under: str = "", *, exact: bool) -> list[tuple[str, int, str]]:
    """The regular files of the directory ``local`` as the objects ``<under>/<name>`` of
    ``target`` (``under`` empty: the log dir's root files), each with its mtime in the
    ``mtime`` metadata. With ``exact``, the objects directly under ``<under>/`` that are not
    among them are then removed. Returns their fingerprint (name, size, ETag) as listed."""
    prefix = f"{under}/" if under else ""
    names = []
    with os.scandir(local) as it:
        for entry in sorted(it, key=lambda e: e.name):
            if entry.is_file(follow_symlinks=False):
                _put(target, prefix + entry.name, Path(entry.path))
                names.append(prefix + entry.name)
    listed = _directly_under(target, under)
    if exact:
        for o in listed:
            if o.name not in names:
                _delete(target, o.name)
    by_name = {o.name: o for o in listed}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KafkaCleanerError(f"{target.uri}: uploaded objects are not listed: {missing[:5]}")
    return fingerprint([by_name[n] for n in names])


def _directly_under(target: ObjectLogDir, under: str) -> list[ObjectInfo]:
    if under:
        return [o for o in target.listing(under + "/") if "/" not in o.name[len(under) + 1:]]
    return target.listing(top_level=True)


def _put(target: ObjectLogDir, name: str, path: Path) -> None:
    metadata = {MTIME_METADATA: mtime_text(path.stat().st_mtime_ns)}
    try:  # boto3's managed transfer: multipart above 8 MiB, so a segment of any size
        s3_client().upload_file(str(path), target.bucket, target.key(name), ExtraArgs={"Metadata": metadata})
    except Exception as e:  # boto3's S3UploadFailedError, ClientError, EndpointConnectionError
        raise KafkaCleanerError(f"{target.uri}/{name}: cannot write the object: {e}") from e


def _delete(target: ObjectLogDir, name: str) -> None:
    try:
        s3_client().delete_object(Bucket=target.bucket, Key=target.key(name))
    except Exception as e:
        raise KafkaCleanerError(f"{target.uri}/{name}: cannot remove the object: {e}") from e


def withdraw_success(output: ObjectLogDir) -> None:
    """Step 1: the output is no longer whole from here until the commit writes ``_SUCCESS``."""
    _delete(output, SUCCESS)


def read_success(output: ObjectLogDir) -> dict[str, Any] | None:
    """The output's ``_SUCCESS`` manifest, or None when the output is not whole."""
    try:
        body = s3_client().get_object(Bucket=output.bucket, Key=output.key(SUCCESS))["Body"].read()
    except Exception as e:
        if getattr(e, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise KafkaCleanerError(f"{output.uri}/{SUCCESS}: cannot read it: {e}") from e
    return json.loads(body)


def write_success(output: ObjectLogDir, run_id: str, identity: Mapping[str, Any]) -> None:
    """Step 3, last: the output is whole, and these are its objects."""
    body = json.dumps({"runId": run_id, "committer": "kafka-cleaner spark compact", **identity}, indent=1)
    try:
        s3_client().put_object(Bucket=output.bucket, Key=output.key(SUCCESS), Body=body.encode(),
                             ContentType="application/json")  # fmt: skip
    except Exception as e:
        raise KafkaCleanerError(f"{output.uri}/{SUCCESS}: cannot write it: {e}") from e


def output_identity(log_dirs: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """What a commit left in object storage: per output log dir (its URI, and the partition
    directories the run wrote), the fingerprint of its root files and of those partitions'
    objects. JSON-shaped, like ``commit.commit_identity``, for the run's ``COMMITTED`` marker
    and ``_SUCCESS``."""
    objects: dict[str, Any] = {}
    for uri, partitions in log_dirs.items():
        wanted = sorted(partitions)
        listed = ObjectLogDir.parse(uri).listing()
        kept = [o for o in listed if "/" not in o.name or o.name.partition("/")[0] in wanted]
        objects[uri] = {"partitions": wanted, "objects": [[o.name, o.size, o.etag] for o in kept]}
    return {"objects": objects}


def holds_output(output: ObjectLogDir, run_id: str, identity: Mapping[str, Any]) -> bool:
    """Whether the output is still marked whole by this run and holds what its commit
    recorded (``output_identity``): a rerun trusts its ``COMMITTED`` marker only then."""
    if (read_success(output) or {}).get("runId") != run_id:
        return False
    objects = identity["objects"]
    current = output_identity({uri: entry["partitions"] for uri, entry in objects.items()})
    return current == json.loads(json.dumps(identity))


def fetch_root_file(log_dir: ObjectLogDir, name: str, path: Path) -> bool:
    """The root file ``name`` of ``log_dir`` to ``path``, if it has one."""
    listed = {o.name: o for o in _directly_under(log_dir, "")}
    if name not in listed:
        return False
    object_store.download(log_dir, listed[name], path)
    return True
