"""The sidecar's ``inSync`` section (issue 20, item 6): its own broker's place in the ISRs, read
from the ``__cluster_metadata`` on the broker's disk each scan, current as the controller
appends (the Paced rollout's gate reads it; ``cleaner/in_sync.py``)."""

from __future__ import annotations

import uuid
from pathlib import Path

from metadata_logs import fence, isr_change, partition_record, register_broker, topic_record, write_metadata
from sidecar_helpers import new_sidecar, next_scan, write_policy

from cleaner.records.builder import build_batch
from cleaner.records.record import Record

T0 = 1_790_000_000_000
ORDERS = uuid.UUID(int=1)


def _broker_disk(root: Path, node_id: int | None) -> Path:
    data = root / "data"
    data.mkdir(parents=True)
    if node_id is not None:
        (data / "meta.properties").write_text(f"version=1\nnode.id={node_id}\ncluster.id=test\n")
    write_metadata(
        data,
        [
            (T0, [register_broker(b, fenced=False) for b in (1, 2)]),
            (T0, [topic_record("orders", ORDERS), partition_record(0, [1, 2], [1, 2], 1, ORDERS)]),
        ],
    )
    return data


def _append(data: Path, base_offset: int, ts: int, values: list[bytes]) -> None:
    """The controller appends a batch to the metadata log while the sidecar runs."""
    batch = build_batch(
        [Record(base_offset + i, ts, None, v, ()) for i, v in enumerate(values)], base_offset=base_offset
    )
    with open(data / "__cluster_metadata-0" / "00000000000000000000.log", "ab") as f:
        f.write(batch)


def test_the_status_follows_the_isr_as_the_controller_appends(tmp_path: Path) -> None:
    data = _broker_disk(tmp_path, node_id=1)
    sc = new_sidecar(write_policy(tmp_path / "p.yaml"), [data])
    first = next_scan(sc)["inSync"]
    assert first["brokerId"] == 1 and first["replicas"] == 1 and first["metadataTimeMs"] == T0
    assert first["outOfIsr"]["count"] == first["underReplicated"]["count"] == first["atMinIsr"]["count"] == 0
    # Broker 2 stops: broker 1 is now the only copy in sync of orders-0.
    _append(data, 3, T0 + 1_000, [fence(2), isr_change(0, [1], topic_id=ORDERS)])
    after = next_scan(sc)["inSync"]
    assert after["metadataTimeMs"] == T0 + 1_000 and after["metadataOffset"] == 5
    assert after["underReplicated"] == {"count": 1, "examples": ["orders-0"]}
    assert after["atMinIsr"] == {"count": 1, "examples": ["orders-0"]}


def test_no_section_without_a_broker_id(tmp_path: Path) -> None:
    data = _broker_disk(tmp_path, node_id=None)
    sc = new_sidecar(write_policy(tmp_path / "p.yaml"), [data])
    assert "inSync" not in next_scan(sc)
