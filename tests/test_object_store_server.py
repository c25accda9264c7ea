"""The tests' object store (tests/object_store.py, gofakes3 on a directory) answers as S3 does
the requests a cleaning job sends through boto3: buckets, whole and ranged reads, listings by
prefix and delimiter a page at a time, copies, batch deletes and multipart uploads. A test that
fails here says the store, not the job, is wrong."""

from __future__ import annotations

import hashlib
import itertools
import os
import pathlib
import random
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from object_store import ObjectStore

MiB = 1 << 20
_buckets = itertools.count()


@pytest.fixture
def bucket(object_store: ObjectStore) -> str:
    """A new, empty bucket of the session's store."""
    name = f"test-{os.getpid()}-{next(_buckets)}"
    object_store.client().create_bucket(Bucket=name)
    return name


def _put(s3, bucket: str, *keys: str) -> None:
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())


def _status(error: ClientError) -> int:
    return error.response["ResponseMetadata"]["HTTPStatusCode"]


def test_create_bucket(object_store: ObjectStore) -> None:
    s3 = object_store.client()
    name = f"created-{os.getpid()}"
    s3.create_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=name)
    with pytest.raises(ClientError) as absent:
        s3.head_bucket(Bucket=f"absent-{os.getpid()}")
    assert _status(absent.value) == 404


def test_put_then_get(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    body = bytes(range(256)) * 3
    s3.put_object(Bucket=bucket, Key="topic-0/00000000000000000000.log", Body=body)
    got = s3.get_object(Bucket=bucket, Key="topic-0/00000000000000000000.log")
    assert got["Body"].read() == body
    assert got["ContentLength"] == len(body)
    with pytest.raises(ClientError) as absent:
        s3.get_object(Bucket=bucket, Key="topic-0/00000000000000000001.log")
    assert absent.value.response["Error"]["Code"] == "NoSuchKey"


def test_overwrite_replaces_the_object(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    s3.put_object(Bucket=bucket, Key="k", Body=b"first, and longer")
    s3.put_object(Bucket=bucket, Key="k", Body=b"second")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"second"


def test_list_by_prefix_and_delimiter(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    _put(s3, bucket, "top.txt", "topic-0/0.log", "topic-0/0.index", "topic-1/0.log", "topic-10/0.log", "other/0.log")

    def listed(**kw: str) -> tuple[list[str], list[str]]:
        page = s3.list_objects_v2(Bucket=bucket, **kw)
        return ([c["Key"] for c in page.get("Contents", [])],
                [p["Prefix"] for p in page.get("CommonPrefixes", [])])  # fmt: skip

    assert listed(Delimiter="/") == (["top.txt"], ["other/", "topic-0/", "topic-1/", "topic-10/"])
    # A prefix that stops inside a name (S3 rolls up what follows it up to the delimiter).
    assert listed(Prefix="topic-", Delimiter="/") == ([], ["topic-0/", "topic-1/", "topic-10/"])
    assert listed(Prefix="top", Delimiter="/") == (["top.txt"], ["topic-0/", "topic-1/", "topic-10/"])
    assert listed(Prefix="topic-0/", Delimiter="/") == (["topic-0/0.index", "topic-0/0.log"], [])
    assert listed(Prefix="topic-1") == (["topic-1/0.log", "topic-10/0.log"], [])
    assert listed(Prefix="topic-2/", Delimiter="/") == ([], [])


def test_a_prefix_whose_objects_are_deleted_is_gone(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    _put(s3, bucket, "gone/a/0.log", "kept/0.log")
    s3.delete_object(Bucket=bucket, Key="gone/a/0.log")
    page = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in page.get("CommonPrefixes", [])] == ["kept/"]
    assert s3.list_objects_v2(Bucket=bucket, Prefix="gone/").get("Contents", []) == []


def test_list_a_page_at_a_time(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    keys = [f"segments/{i:020d}.log" for i in range(5)]
    _put(s3, bucket, *reversed(keys))
    pages, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, Prefix="segments/", MaxKeys=2, **kw)
        pages.append(([c["Key"] for c in page.get("Contents", [])], page["IsTruncated"], page["KeyCount"]))
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
        assert len(pages) < 10, "the listing does not end"
    assert pages == [(keys[0:2], True, 2), (keys[2:4], True, 2), (keys[4:5], False, 1)]


def test_common_prefixes_count_towards_a_page(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    _put(s3, bucket, "a/0", "a/1", "b", "c/0", "c/1", "d")
    paginator = s3.get_paginator("list_objects_v2")
    pages = [
        ([c["Key"] for c in p.get("Contents", [])], [c["Prefix"] for c in p.get("CommonPrefixes", [])])
        for p in paginator.paginate(Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 2})
    ]
    assert pages == [(["b"], ["a/"]), (["d"], ["c/"])]


def test_ranged_get(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    body = bytes(range(100))
    s3.put_object(Bucket=bucket, Key="segment.log", Body=body)
    part = s3.get_object(Bucket=bucket, Key="segment.log", Range="bytes=10-19")
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["Body"].read() == body[10:20]
    assert part["ContentLength"] == 10
    assert part["ContentRange"] == "bytes 10-19/100"
    assert s3.get_object(Bucket=bucket, Key="segment.log", Range="bytes=95-")["Body"].read() == body[95:]
    assert s3.get_object(Bucket=bucket, Key="segment.log", Range="bytes=-3")["Body"].read() == body[-3:]
    with pytest.raises(ClientError) as beyond:
        s3.get_object(Bucket=bucket, Key="segment.log", Range="bytes=100-")
    assert _status(beyond.value) == 416


def test_head_object(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    body = b"x" * 12345
    s3.put_object(Bucket=bucket, Key="k", Body=body)
    head = s3.head_object(Bucket=bucket, Key="k")
    assert head["ContentLength"] == 12345
    assert head["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    with pytest.raises(ClientError) as absent:
        s3.head_object(Bucket=bucket, Key="absent")
    assert _status(absent.value) == 404


def test_copy_object(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    body = os.urandom(4096)
    s3.put_object(Bucket=bucket, Key="staging/0.log", Body=body)
    s3.copy_object(Bucket=bucket, Key="final/0.log", CopySource={"Bucket": bucket, "Key": "staging/0.log"})
    assert s3.get_object(Bucket=bucket, Key="final/0.log")["Body"].read() == body
    assert s3.get_object(Bucket=bucket, Key="staging/0.log")["Body"].read() == body


def test_delete_objects(object_store: ObjectStore, bucket: str) -> None:
    s3 = object_store.client()
    _put(s3, bucket, "d/0", "d/1", "d/2")
    deleted = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d/0"}, {"Key": "d/2"}]})
    assert sorted(d["Key"] for d in deleted["Deleted"]) == ["d/0", "d/2"]
    assert not deleted.get("Errors")
    assert [c["Key"] for c in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["d/1"]
    with pytest.raises(ClientError) as gone:
        s3.head_object(Bucket=bucket, Key="d/0")
    assert _status(gone.value) == 404


def test_multipart_upload(object_store: ObjectStore, bucket: str, tmp_path: pathlib.Path) -> None:
    s3 = object_store.client()
    parts: list[int] = []  # the part numbers boto3 uploads: a multipart upload it was

    def record_part(params: dict, **_: object) -> None:
        parts.append(params["PartNumber"])

    s3.meta.events.register("before-parameter-build.s3.UploadPart", record_part)
    body = random.Random(7).randbytes(12 * MiB)
    source = tmp_path / "segment.log"
    source.write_bytes(body)
    # Over an object of one PUT: what the upload writes replaces it whole.
    s3.put_object(Bucket=bucket, Key="big/segment.log", Body=b"an older, smaller object")
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=3)
    s3.upload_file(str(source), bucket, "big/segment.log", Config=config)
    assert sorted(parts) == [1, 2, 3]
    got = s3.get_object(Bucket=bucket, Key="big/segment.log")["Body"].read()
    assert len(got) == len(body)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest()
    # A range across the boundary of the first two parts.
    seam = s3.get_object(Bucket=bucket, Key="big/segment.log", Range=f"bytes={5 * MiB - 8}-{5 * MiB + 7}")
    assert seam["Body"].read() == body[5 * MiB - 8 : 5 * MiB + 8]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_env_reaches_it_from_another_process(object_store: ObjectStore, bucket: str) -> None:
    object_store.client().put_object(Bucket=bucket, Key="from/here", Body=b"read over there")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | object_store.env()
    script = f"import boto3; print(boto3.client('s3').get_object(Bucket={bucket!r}, Key='from/here')['Body'].read())"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b'read over there'"


def test_an_interrupted_put_leaves_the_bucket_listable(object_store: ObjectStore, bucket: str) -> None:
    """A writer killed in the middle of a PUT (the crash tests kill jobs): the bucket still lists,
    without the half-written object."""
    s3 = object_store.client(retries={"max_attempts": 1})
    _put(s3, bucket, "kept")
    url = urllib.parse.urlsplit(object_store.endpoint_url)
    with socket.create_connection((url.hostname, url.port)) as conn:
        conn.sendall(f"PUT /{bucket}/half HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: 100000\r\n\r\n".encode())
        conn.sendall(b"x" * 1000)
    deadline, listed = time.monotonic() + 5, None
    while time.monotonic() < deadline:
        try:
            listed = [c["Key"] for c in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        except ClientError as e:
            listed = e.response["Error"]["Code"]
        if listed == ["kept"]:
            break
        time.sleep(0.05)
    assert listed == ["kept"]


@pytest.mark.parametrize("key", ["marker/", "a//b", "a/../b", "../other/k"])
def test_keys_it_cannot_hold_are_refused(object_store: ObjectStore, bucket: str, key: str) -> None:
    """Not S3's behaviour, the store's limit (tests/objectstore/cmd/s3server): a key with an
    empty, "." or ".." part is refused, not stored under another name."""
    s3 = object_store.client()
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    assert refused.value.response["Error"]["Code"] == "InvalidArgument"
    assert s3.list_objects_v2(Bucket=bucket).get("Contents", []) == []
