"""Which partition a producer sends a key to: Kafka's default partitioner.

A keyed record goes to ``toPositive(murmur2(key)) % numPartitions`` (``BuiltInPartitioner.
partitionForKey``, the same in the Java producer since 0.8.2 and in every client that
follows it). ``kafka-cleaner where`` reads only the partition that can hold a key.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: 32-bit MurmurHash2 with Kafka's seed, as a signed int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    left = length - whole
    if left == 3:
        h ^= data[whole + 2] << 16
    if left >= 2:
        h ^= data[whole + 1] << 8
    if left >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``num_partitions``."""
    if num_partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
