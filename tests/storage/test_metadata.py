"""meta.properties, partition.metadata, leader-epoch-checkpoint and .kafka_cleanshutdown:
parsers, byte-exact writers, and every real Kafka file."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleaner.errors import CorruptCheckpointError
from cleaner.storage import files, metadata
from cleaner.storage.metadata import (
    CleanShutdown,
    EpochEntry,
    MetaProperties,
    PartitionMetadata,
    decode_uuid,
    encode_uuid,
    format_java_date,
    format_meta_properties,
    java_properties_order,
    parse_java_properties,
    parse_leader_epoch_checkpoint,
    parse_meta_properties,
    parse_partition_metadata,
    read_clean_shutdown,
    read_leader_epoch_checkpoint,
    read_meta_properties,
    read_partition_metadata,
    write_meta_properties,
    write_partition_metadata,
)

TOPIC_ID = "pXmTMPbFQWWlhOl_-Vq9sA"


# ---------------------------------------------------------------------------------------
# meta.properties


def test_meta_properties_v1_bytes_match_kafka_3_7_on_jdk17():
    # LDI-POC/meta.properties, written by Kafka 3.7.0 (KRaft): ConcurrentHashMap order.
    meta = MetaProperties(1, "q1w2e3r4t5y6u7i8o9p0", 1, "XHhkr4tkSsD900pOQ8pPfg")
    data = format_meta_properties(meta, now_ms=1769791431000)
    assert data == (
        b"#\n#Fri Jan 30 16:43:51 UTC 2026\nnode.id=1\ndirectory.id=XHhkr4tkSsD900pOQ8pPfg\n"
        b"version=1\ncluster.id=q1w2e3r4t5y6u7i8o9p0\n"
    )


def test_meta_properties_orders():
    meta = MetaProperties(0, "d0053poFTbGwSWThjV1DEg", 0)
    assert format_meta_properties(meta, date_text="Sat Jun 03 20:13:09 CST 2023", order="hashtable") == (
        b"#\n#Sat Jun 03 20:13:09 CST 2023\ncluster.id=d0053poFTbGwSWThjV1DEg\nversion=0\nbroker.id=0\n"
    )
    assert format_meta_properties(meta, date_text="D", order="sorted") == (
        b"#\n#D\nbroker.id=0\ncluster.id=d0053poFTbGwSWThjV1DEg\nversion=0\n"
    )
    assert java_properties_order(["version", "broker.id"], "hashtable") == ["version", "broker.id"]
    with pytest.raises(ValueError):
        format_meta_properties(meta)  # the date must be given


def test_format_java_date():
    assert format_java_date(0) == "Thu Jan 01 00:00:00 UTC 1970"
    assert format_java_date(1_700_000_000_000) == "Tue Nov 14 22:13:20 UTC 2023"


def test_write_meta_properties_round_trip(tmp_path):
    meta = MetaProperties(1, "MkU3OEVBNTcwNTJENDM2Qg", 3, "XHhkr4tkSsD900pOQ8pPfg")
    write_meta_properties(tmp_path, meta, now_ms=1_700_000_000_000)
    assert os.listdir(tmp_path) == ["meta.properties"]
    back = read_meta_properties(tmp_path)
    assert back == meta and back.broker_id == 3
    v0 = MetaProperties(0, None, 7)
    write_meta_properties(tmp_path / "meta.properties", v0, date_text="x")
    assert read_meta_properties(tmp_path / "meta.properties") == v0
    assert (tmp_path / "meta.properties").read_bytes() == b"#\n#x\nbroker.id=7\nversion=0\n"


def test_write_meta_properties_failure_keeps_old(tmp_path, monkeypatch):
    write_meta_properties(tmp_path, MetaProperties(0, None, 1), date_text="x")
    old = (tmp_path / "meta.properties").read_bytes()

    def eio(*_args):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(files, "rename", eio)
    with pytest.raises(OSError):
        write_meta_properties(tmp_path, MetaProperties(0, None, 2), date_text="y")
    assert (tmp_path / "meta.properties").read_bytes() == old
    assert os.listdir(tmp_path) == ["meta.properties"]


def test_java_properties_parser():
    text = (
        "# comment\n! other comment\n\n   \nkey1=value1\nkey2 = value 2 \nkey3:v3\nkey4 v4\n"
        "key\\ 5=a\\=b\\:c\\\\d\\u0041\\t\nlong=first \\\n    second\nempty=\nk\\\n  ey6=x\n"
    )
    props = parse_java_properties(text)
    assert props == {
        "key1": "value1",
        "key2": "value 2 ",
        "key3": "v3",
        "key4": "v4",
        "key 5": "a=b:c\\dA\t",
        "long": "first second",
        "empty": "",
        "key6": "x",
    }
    with pytest.raises(ValueError):
        parse_java_properties("k=\\u00zz")


@given(st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=10), max_size=6))
def test_java_properties_store_load_round_trip(props):
    # Properties.store escapes, Properties.load unescapes (we read the text back as written).
    data = metadata.format_java_properties(props, date_text="d", order="sorted")
    assert parse_java_properties(data.decode("utf-8")) == props


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"version=2\nbroker.id=0\n", "Unknown meta.properties version"),
        (b"version=0\nbroker.id=x\n", "broker.id"),
        (b"version=1\ncluster.id=c\n", "node.id"),
        (b"version=1\nnode.id=1\n", "cluster.id was not found"),
        (b"version=1\nnode.id=1\ncluster.id=c\ndirectory.id=nope\n", "directory.id"),
        (b"version=0\nbroker.id=\\u12\n", "Malformed"),
    ],
)
def test_bad_meta_properties(tmp_path, text, reason):
    path = tmp_path / "meta.properties"
    path.write_bytes(text)
    with pytest.raises(CorruptCheckpointError) as info:
        read_meta_properties(path)
    assert reason in info.value.reason and info.value.path == str(path)
    assert path.read_bytes() == text


def test_meta_properties_defaults_and_extras():
    meta = parse_meta_properties(b"broker.id=4\nextra.key=1\n")
    assert meta.version == 0 and meta.node_id == 4 and meta.cluster_id is None
    assert meta.properties["extra.key"] == "1"
    assert parse_meta_properties(b"version=0\n").node_id is None


# ---------------------------------------------------------------------------------------
# partition.metadata


def test_partition_metadata_bytes_and_round_trip(tmp_path):
    write_partition_metadata(tmp_path, TOPIC_ID)
    data = (tmp_path / "partition.metadata").read_bytes()
    assert data == b"version: 0\ntopic_id: " + TOPIC_ID.encode()  # no trailing newline
    assert len(data) == 43
    assert read_partition_metadata(tmp_path) == PartitionMetadata(0, TOPIC_ID)
    write_partition_metadata(tmp_path / "partition.metadata", decode_uuid(TOPIC_ID))
    assert (tmp_path / "partition.metadata").read_bytes() == data
    assert os.listdir(tmp_path) == ["partition.metadata"]
    with pytest.raises(ValueError):
        write_partition_metadata(tmp_path, "AAAAAAAAAAAAAAAAAAAAAA")  # the zero Uuid


@given(st.binary(min_size=16, max_size=16))
def test_uuid_round_trip(raw):
    text = encode_uuid(raw)
    assert len(text) == 22 and re.fullmatch(r"[A-Za-z0-9_-]{22}", text)
    assert decode_uuid(text) == raw
    assert decode_uuid(text + "==") == raw  # Java's decoder accepts padding


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "malformed line"),
        (b"version: 0", "missing 'topic_id'"),
        (b"version: 0\n", "missing 'topic_id'"),
        (b"version:0\ntopic_id: " + TOPIC_ID.encode(), "malformed line"),  # ":\s+" needs whitespace
        (b"version: -1\ntopic_id: " + TOPIC_ID.encode(), "Unrecognized version"),
        (b"version: x\ntopic_id: " + TOPIC_ID.encode(), "malformed line"),
        (b"version: 0\ntopic: " + TOPIC_ID.encode(), "malformed line"),
        (b"version: 0\ntopic_id: short", "malformed line"),
        (b"version: 0\ntopic_id: " + TOPIC_ID.encode() + b" ", "malformed line"),
        (b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", "zero Uuid"),
        (b"version: 0\ntopic_id: pXmTMPbFQWWlhOl/+Vq9sA", "malformed line"),  # not URL-safe base64
    ],
)
def test_bad_partition_metadata(tmp_path, data, reason):
    path = tmp_path / "partition.metadata"
    path.write_bytes(data)
    with pytest.raises(CorruptCheckpointError) as info:
        read_partition_metadata(path)
    assert reason in info.value.reason
    assert path.read_bytes() == data


def test_partition_metadata_accepts_newer_version_and_extra_lines():
    pm = parse_partition_metadata(b"version: 1\ntopic_id: " + TOPIC_ID.encode() + b"\nfuture: x\n")
    assert pm == PartitionMetadata(1, TOPIC_ID) and pm.topic_id_bytes == decode_uuid(TOPIC_ID)


# ---------------------------------------------------------------------------------------
# leader-epoch-checkpoint and .kafka_cleanshutdown


def test_leader_epoch_checkpoint(tmp_path):
    assert parse_leader_epoch_checkpoint(b"0\n2\n0 0\n3 1234\n") == [EpochEntry(0, 0), EpochEntry(3, 1234)]
    assert read_leader_epoch_checkpoint(tmp_path) == []  # missing: no entries, nothing created
    assert os.listdir(tmp_path) == []
    for bad in (b"0\n1\n0\n", b"0\n1\nx 0\n", b"1\n0\n", b"0\n2\n0 0\n"):
        with pytest.raises(CorruptCheckpointError):
            parse_leader_epoch_checkpoint(bad)


def test_clean_shutdown(tmp_path):
    assert read_clean_shutdown(tmp_path) is None
    marker = tmp_path / ".kafka_cleanshutdown"
    marker.write_bytes(b"")
    assert read_clean_shutdown(tmp_path) == CleanShutdown(str(marker), None)  # older brokers: empty file
    marker.write_bytes(b'{"version":0,"brokerEpoch":4294967306}')
    assert read_clean_shutdown(tmp_path).broker_epoch == 4294967306
    marker.write_bytes(b"{not json")
    assert read_clean_shutdown(tmp_path) == CleanShutdown(str(marker), None)  # still a clean shutdown


# ---------------------------------------------------------------------------------------
# Real Kafka files (read-only)


@pytest.mark.fixtures
def test_every_real_metadata_file_parses(real_kafka_root):
    seen = {"meta.properties": 0, "partition.metadata": 0, "leader-epoch-checkpoint": 0, ".kafka_cleanshutdown": 0}
    for path in sorted(real_kafka_root.rglob("*")):
        if not path.is_file() or path.name not in seen:
            continue
        seen[path.name] += 1
        before = path.read_bytes()
        if path.name == "meta.properties":
            meta = read_meta_properties(path)
            assert meta.node_id is not None
            lines = before.decode().split("\n")
            date = lines[1][1:]
            # Our writer reproduces the broker's bytes with the order of its JDK.
            assert before in {
                format_meta_properties(meta, date_text=date, order=order) for order in ("chm", "hashtable")
            }, path
        elif path.name == "partition.metadata":
            pm = read_partition_metadata(path)
            assert pm.encode() == before
        elif path.name == "leader-epoch-checkpoint":
            entries = read_leader_epoch_checkpoint(path)
            assert [e.start_offset for e in entries] == sorted(e.start_offset for e in entries)
        else:
            assert read_clean_shutdown(path.parent) is not None
        assert path.read_bytes() == before
    assert seen["meta.properties"] >= 5 and seen["partition.metadata"] >= 10 and seen["leader-epoch-checkpoint"] >= 30


JAVA_STORE = """
import java.io.*;
import java.util.*;
public class Store {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        for (int i = 0; i + 1 < args.length; i += 2) props.setProperty(args[i], args[i + 1]);
        StringWriter out = new StringWriter();
        PrintWriter pw = new PrintWriter(out);
        props.store(pw, "");   // PropertiesUtils.writePropertiesFile
        System.out.println(System.getProperty("java.specification.version"));
        System.out.print(out);
    }
}
"""


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK installed (make setup installs one as root)")
def test_properties_order_matches_the_installed_jdk(tmp_path):
    src = tmp_path / "Store.java"
    src.write_text(JAVA_STORE)
    meta = MetaProperties(1, "q1w2e3r4t5y6u7i8o9p0", 1, "XHhkr4tkSsD900pOQ8pPfg")
    args = [x for kv in meta.to_properties().items() for x in kv]
    out = subprocess.run(["java", str(src), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    spec, java_text = out.stdout.split("\n", 1)
    order = "sorted" if int(spec.split(".")[-1]) >= 18 else "chm"
    date = java_text.split("\n")[1][1:]
    assert format_meta_properties(meta, date_text=date, order=order).decode() == java_text


def test_clean_shutdown_file_as_kafka_writes_it(tmp_path) -> None:
    """Kafka's CleanShutdownFileHandler writes snake_case keys with string values."""
    (tmp_path / ".kafka_cleanshutdown").write_bytes(b'{"broker_epoch":"42","version":"0"}')
    marker = read_clean_shutdown(tmp_path)
    assert marker is not None and marker.broker_epoch == 42
