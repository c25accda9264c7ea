"""The JSON schema of the sidecar's ``/status`` document, version 1 (issue 4's contract).

``docs/sidecar-status-v1.schema.json`` is this dict written out (a test keeps the two equal);
it lives here too because the operator validates every report against it at run time, and
the wheel ships Python modules, not files under ``docs/``.

Compatibility: version 1 may gain optional fields (the operator ignores fields it does not
know); removing, renaming or retyping a field, or making one required, is version 2.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMA", "SCHEMA_ID", "VERSION"]

VERSION = 1
SCHEMA_ID = "https://kafkacleaner.io/schemas/sidecar-status-v1.schema.json"

_RFC3339 = {"type": "string", "format": "date-time"}
_RFC3339_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_COUNT = {"type": "integer", "minimum": 0}
_BYTES = {"type": "integer", "minimum": 0}
_RATIO = {"type": "number", "minimum": 0, "maximum": 1}
_SECONDS = {"type": "number", "minimum": 0}

_PARTITION_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["count", "examples"],
    "properties": {
        "count": _COUNT,
        "examples": {"type": "array", "maxItems": 5, "items": {"type": "string"}},
    },
}

_DELETION: dict[str, Any] = {
    "type": ["object", "null"],
    "description": (
        "The partition's deletion deadline (cleaner.deletion): how long superseded records (a value or tombstone "
        "with a newer record for its key) and tombstones past their delete horizon have been on disk, against "
        "deletionDeadlineMs (default: max.compaction.lag.ms when set), and what holds them back. Optional; null "
        "or absent when not computed (not compacted, not yet read)."
    ),
    "required": ["oldestSupersededAgeSeconds", "oldestExpiredTombstoneAgeSeconds", "supersededRecords",
                 "deadlineSeconds", "breached", "remainingSeconds", "heldBackBy", "bounded"],
    "properties": {
        "oldestSupersededAgeSeconds": {
            "type": ["number", "null"],
            "minimum": 0,
            "description": "Since the earliest overwrite or tombstone of a key whose older record is still on disk; "
            "null: none.",
        },
        "oldestExpiredTombstoneAgeSeconds": {
            "type": ["number", "null"],
            "minimum": 0,
            "description": "How long the oldest tombstone on disk has been past its delete horizon; null: none.",
        },
        "supersededRecords": _COUNT,
        "deadlineSeconds": {"type": ["number", "null"], "minimum": 0, "description": "null: no deadline."},
        "breached": {"type": "boolean"},
        "remainingSeconds": {
            "type": ["number", "null"],
            "description": "Deadline minus the larger age; negative when breached; null without a deadline or age.",
        },
        "heldBackBy": {
            "enum": ["activeSegment", "lso", "minCompactionLag", "dirtyRatio", "paused", "uncleanable", "cleaning",
                     "cleaner", "replicaOutOfSync", None],
            "description": "What keeps the next clean from removing them (docs/runbooks.md, "
            "KafkaCleanerDeletionDeadlineBreached).",
        },
        "bounded": {
            "type": "boolean",
            "description": "The partition's keys overflowed the offset map (the cleaner's dedupe buffer per thread): "
            "the age and count are lower bounds.",
        },
        "computedAtMs": {
            "type": "integer",
            "description": "When the records were read (epoch ms): at most every reporting.deletionIntervalSeconds, "
            "and only when the segments changed.",
        },
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "kafka-cleaner sidecar /status, version 1",
    "description": (
        "What `kafka-cleaner sidecar` serves at GET /status (Content-Type: application/json) and "
        "the operator pulls every reporting.intervalSeconds. `partitions` holds the top "
        "reporting.topPartitions partitions by cleanable ratio plus every uncleanable one, "
        "`errors` the last 20; the whole document stays under 64 KiB. Optional fields may be "
        "added within version 1; anything else needs version 2."
    ),
    "type": "object",
    "required": ["version", "broker", "mode", "policyGeneration", "scannedAt", "logDirs", "cleaner",
                 "topics", "partitions", "errors"],
    "properties": {
        "version": {"const": VERSION, "description": "The version of this document's format."},
        "broker": {"type": "string", "minLength": 1, "maxLength": 253,
                   "description": "--broker-name: the pod name (the operator passes $(POD_NAME))."},
        "mode": {"enum": ["observe", "compact", "stage"], "description": "spec.mode of the loaded policy."},
        "policyGeneration": {
            "type": ["integer", "null"], "minimum": 0,
            "description": (
                "metadata.generation of the loaded policy file; for a file without one, a counter of the "
                "distinct contents the sidecar loaded (1, 2, ...); null before a policy is loaded."
            ),
        },
        "scannedAt": _RFC3339_OR_NULL | {"description": "End of the last completed scan; null before the first."},
        "logDirs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path", "partitions", "lockHeldByBroker", "freeBytes", "uncleanablePartitions"],
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "Log dir, after glob expansion."},
                    "partitions": _COUNT,
                    "lockHeldByBroker": {"type": ["boolean", "null"],
                                         "description": "Whether a broker holds the dir's .lock; null: unknown."},
                    "freeBytes": _BYTES,
                    "uncleanablePartitions": _COUNT,
                },
            },
        },
        "cleaner": {
            "type": "object",
            "required": ["threads", "deadThreads", "lastRunAt", "maxDirtyRatio", "maxCompactionDelaySeconds",
                         "bytesReclaimedTotal", "stagedBytes", "state"],
            "properties": {
                "threads": _COUNT,
                "deadThreads": _COUNT,
                "lastRunAt": _RFC3339_OR_NULL,
                "maxDirtyRatio": _RATIO,
                "maxCompactionDelaySeconds": _SECONDS,
                "bytesReclaimedTotal": _BYTES,
                "stagedBytes": _BYTES,
                "state": {
                    "enum": ["starting", "observing", "idle", "cleaning", "waitingForBroker", "staging",
                             "committing", "paused", "error"],
                    "description": (
                        "starting: before the policy and the start-up gate; observing: observe mode; idle: "
                        "compact or stage mode with nothing to do now (compact: outside its gate and windows); "
                        "cleaning: a compact pass holds .lock; waitingForBroker: in a window, the broker holds "
                        ".lock; staging: a stage round runs; committing: staged sets are committed (gate, "
                        "termination)."
                    ),
                },
            },
        },
        "topics": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["topic", "partitions", "dirtyBytes", "cleanableBytes", "cleanBytes",
                             "maxDirtyRatio", "tombstones", "oldestTombstoneAgeSeconds"],
                "properties": {
                    "topic": {"type": "string", "minLength": 1, "maxLength": 255},
                    "partitions": _COUNT,
                    "dirtyBytes": _BYTES,
                    "cleanableBytes": _BYTES,
                    "cleanBytes": _BYTES,
                    "maxDirtyRatio": _RATIO,
                    "tombstones": _COUNT,
                    "oldestTombstoneAgeSeconds": {"type": ["number", "null"], "minimum": 0},
                    "nextCleanFreedBytes": _BYTES | {"description": "Estimated bytes the next clean frees."},
                    "kafkaPasses": _COUNT | {
                        "description": "Most cleaning passes Kafka's cleaner needs for one partition's dirty section."
                    },
                    "onePassDedupeBufferSize": _BYTES | {
                        "description": "log.cleaner.dedupe.buffer.size that cleans every partition in one pass."
                    },
                    "clusterConfig": {
                        "type": "boolean",
                        "description": "The topic's config came from the cluster's KRaft metadata on this disk "
                        "(false: no metadata log here, the policy's and Kafka's defaults stand).",
                    },
                    "fromPolicy": {
                        "type": "array",
                        "maxItems": 64,
                        "items": {"type": "string", "maxLength": 64},
                        "description": "Config keys whose effective value is the policy rule's "
                        "(status's configSources: policy); the others are the cluster's or Kafka's defaults.",
                    },
                    "oldestSupersededAgeSeconds": {
                        "type": ["number", "null"],
                        "minimum": 0,
                        "description": "Largest deletion.oldestSupersededAgeSeconds of the topic's partitions; "
                        "optional.",
                    },
                    "deletionDeadlineBreaches": _COUNT | {
                        "description": "Partitions of the topic past their deletion deadline; optional."
                    },
                },
            },
        },
        "partitions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["topic", "partition", "logDir", "firstDirtyOffset", "cleanableRatio",
                             "cleanableBytes", "eligible", "reason", "lastCleanedAt", "uncleanableReason"],
                "properties": {
                    "topic": {"type": "string", "minLength": 1, "maxLength": 255},
                    "partition": _COUNT,
                    "logDir": {"type": "string"},
                    "firstDirtyOffset": {"type": "integer"},
                    "cleanableRatio": _RATIO,
                    "cleanableBytes": _BYTES,
                    "eligible": {"type": "boolean"},
                    "reason": {"enum": ["ratio", "lag", "lso", "activeSegment", "uncleanable", "paused", None],
                               "description": "Why the partition is (or is not) eligible for cleaning."},
                    "lastCleanedAt": _RFC3339_OR_NULL,
                    "uncleanableReason": {"type": ["string", "null"]},
                    "lsoHolder": {
                        "type": ["object", "null"],
                        "description": "The open transaction that pins the last stable offset (status's lsoHolder).",
                        "required": ["producerId", "producerEpoch", "firstOffset", "startTimestampMs", "ageSeconds"],
                        "properties": {
                            "producerId": {"type": "integer"},
                            "producerEpoch": {"type": "integer"},
                            "firstOffset": {"type": "integer"},
                            "startTimestampMs": {"type": ["integer", "null"]},
                            "ageSeconds": {"type": ["number", "null"], "minimum": 0},
                        },
                    },
                    "nextClean": {
                        "type": ["object", "null"],
                        "description": "What the next clean would meet (status's nextClean); null if not estimated.",
                        "required": ["dirtyRecords", "dirtyDistinctKeys", "bytesFreed", "kafkaPasses", "passes",
                                     "onePassDedupeBufferSize"],
                        "properties": {
                            "dirtyRecords": _COUNT,
                            "dirtyDistinctKeys": _COUNT,
                            "bytesFreed": _BYTES,
                            "kafkaPasses": _COUNT,
                            "passes": _COUNT,
                            "onePassDedupeBufferSize": _BYTES,
                        },
                    },
                    "deletion": _DELETION,
                },
            },
        },
        "gate": {
            "type": "object",
            "description": (
                "The start-up gate (the sidecar's startupProbe, GET /startupz, holds the broker until it is "
                "open): stage commits its sets, compact runs one bounded pass, observe does nothing."
            ),
            "required": ["state"],
            "properties": {
                "state": {"enum": ["pending", "running", "open"]},
                "startedAt": _RFC3339_OR_NULL,
                "openedAt": _RFC3339_OR_NULL,
            },
        },
        "stage": {
            "type": "object",
            "description": "Stage mode: the staged sets, the refused partitions and the last commit.",
            "required": ["sets", "stagedSets", "refusedPartitions", "refused", "lastCommit"],
            "properties": {
                "sets": _COUNT,
                "stagedSets": {"type": "array", "maxItems": 50, "items": {"type": "object"}},
                "refusedPartitions": _COUNT,
                "refused": {
                    "type": "array",
                    "maxItems": 50,
                    "items": {
                        "type": "object",
                        "required": ["topic", "partition", "logDir", "reason"],
                        "properties": {
                            "topic": {"type": "string"},
                            "partition": _COUNT,
                            "logDir": {"type": "string"},
                            "reason": {"type": "string"},
                        },
                    },
                },
                "lastCommit": {"type": "array", "items": {"type": "object"}},
            },
        },
        "inSync": {
            "type": "object",
            "description": (
                "This broker's place in the ISRs, from the KRaft metadata log on its own disk (cleaner/in_sync.py): "
                "what a Paced rollout waits for before and after it restarts a broker. Optional; absent without a "
                "metadata log or a node.id (ZooKeeper mode, a disk without __cluster_metadata)."
            ),
            "required": ["brokerId", "replicas", "outOfIsr", "underReplicated", "atMinIsr", "metadataOffset",
                         "metadataTimeMs"],
            "properties": {
                "brokerId": {"type": "integer", "minimum": 0},
                "replicas": _COUNT | {"description": "Partitions this broker holds a replica of."},
                "outOfIsr": _PARTITION_LIST | {
                    "description": "Partitions it replicates outside the ISR, or all of them while it is fenced."},
                "underReplicated": _PARTITION_LIST | {
                    "description": "Partitions whose ISR holds it and is smaller than the replica set."},
                "atMinIsr": _PARTITION_LIST | {
                    "description": "Partitions whose ISR holds it and has at most min.insync.replicas members (as "
                    "the metadata holds it; Kafka's default 1 where only server.properties sets it): without "
                    "this broker they are below it."},
                "noSpareReplica": _COUNT | {
                    "description": "Partitions whose replication factor is at most min.insync.replicas."},
                "metadataOffset": _COUNT,
                "metadataTimeMs": {"type": "integer", "description": "The newest metadata record's timestamp."},
            },
        },
        "replicas": {
            "type": "object",
            "description": (
                "What the operator compares across the replicas of a partition, for the compacted "
                "partitions that fit (omitted: how many did not; every broker picks the same ones by a hash "
                "of rotation and partition, so the choice moves on every 10 minutes). Only batches of the "
                "dirty section below the high watermark are listed: there every in-sync replica holds the "
                "leader's batches byte for byte."
            ),
            "required": ["rotation", "partitions", "omitted"],
            "properties": {
                "rotation": _COUNT,
                "omitted": _COUNT,
                "partitions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["topic", "partition", "logStartOffset", "logEndOffset", "highWatermark",
                                     "firstDirtyOffset", "cleanBytes", "dirtyBytes", "minCleanableRatio",
                                     "batches"],
                        "properties": {
                            "topic": {"type": "string", "minLength": 1, "maxLength": 255},
                            "partition": _COUNT,
                            "logStartOffset": {"type": "integer"},
                            "logEndOffset": {"type": "integer"},
                            "highWatermark": {"type": ["integer", "null"],
                                              "description": "From replication-offset-checkpoint; null: none."},
                            "firstDirtyOffset": {"type": "integer",
                                                 "description": "The cleaner checkpoint: below it, the clean section."},
                            "cleanBytes": _BYTES,
                            "dirtyBytes": _BYTES,
                            "minCleanableRatio": _RATIO | {"description": "The partition's min.cleanable.dirty.ratio."},
                            "batches": {
                                "type": "array",
                                "maxItems": 4,
                                "description": "[baseOffset, lastOffset, crc] of batches of the dirty section below "
                                               "the high watermark.",
                                "items": {
                                    "type": "array",
                                    "prefixItems": [{"type": "integer"}, {"type": "integer"},
                                                    {"type": "integer", "minimum": 0, "maximum": 4294967295}],
                                    "minItems": 3,
                                    "maxItems": 3,
                                },
                            },
                            "brokerId": _COUNT | {"description": "This replica's broker (node.id), when the sidecar "
                                                                 "knows it."},
                            "replication": {
                                "type": "object",
                                "description": "From __cluster_metadata on this broker's disk, only while a replica of "
                                               "the partition is out of the ISR or its broker fenced (issue 24: the "
                                               "replication race).",
                                "required": ["leader", "isr", "outOfSync"],
                                "properties": {
                                    "leader": {"type": "integer", "description": "-1: no leader."},
                                    "isr": {"type": "array", "items": {"type": "integer"}},
                                    "outOfSync": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["broker", "sinceMs", "offline"],
                                            "properties": {
                                                "broker": {"type": "integer"},
                                                "sinceMs": {"type": "integer",
                                                            "description": "When the controller recorded it out of "
                                                                           "the ISR or fenced (the metadata batch's "
                                                                           "timestamp)."},
                                                "offline": {"type": "boolean",
                                                            "description": "Its broker is fenced or unregistered."},
                                            },
                                        },
                                    },
                                },
                            },
                            "removals": {
                                "type": "array",
                                "maxItems": 64,
                                "description": "[offset, epoch ms]: a tombstone or transaction marker this replica "
                                               "holds at offset that a cleaner may remove from that time on (its "
                                               "stored delete horizon; not cleaned yet: the scan time + "
                                               "delete.retention.ms). In offset order with rising times: the earliest "
                                               "removal at or above an offset is the first point at or above it. "
                                               "Only with replication.",
                                "items": {
                                    "type": "array",
                                    "prefixItems": [{"type": "integer"}, {"type": "integer"}],
                                    "minItems": 2,
                                    "maxItems": 2,
                                },
                            },
                            "openTransaction": {
                                "type": "object",
                                "description": "The transaction open below the high watermark that holds this "
                                               "replica's last stable offset (where it binds the cleaning).",
                                "required": ["producerId", "firstOffset"],
                                "properties": {
                                    "producerId": {"type": "integer"},
                                    "firstOffset": {"type": "integer", "minimum": 0},
                                },
                            },
                        },
                    },
                },
            },
        },
        "compact": {
            "type": "object",
            "description": "Compact mode: the maintenance windows and whether now is inside one.",
            "properties": {"windows": {"type": "array", "items": {"type": "string"}}, "inWindow": {"type": "boolean"}},
        },
        "warnings": {
            "type": "array",
            "maxItems": 20,
            "items": {"type": "string", "maxLength": 1024},
            "description": (
                "What works, but not as the policy asks (optional): a writing mode refused for the "
                "sidecar's uid (it observes meanwhile), policy fields this sidecar does not know and ignores "
                "(a newer operator's)."
            ),
        },
        "errors": {
            "type": "array",
            "maxItems": 20,
            "items": {
                "type": "object",
                "required": ["at", "message"],
                "properties": {
                    "at": _RFC3339,
                    "logDir": {"type": ["string", "null"]},
                    "partition": {"type": ["string", "null"], "description": "topic-partition, e.g. orders-3"},
                    "message": {"type": "string"},
                },
            },
        },
    },
}
