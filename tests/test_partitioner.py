"""murmur2 / default partitioner: identical to the Java client's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kp_murmur2

from loglake.records import default_partition, murmur2
from loglake.records.partitioner import to_positive

# From Kafka's UtilsTest.testMurmur2 (org.apache.kafka.common.utils)
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _signed(u: int) -> int:
    return u - (1 << 32) if u & 0x80000000 else u


@pytest.mark.parametrize(("data", "want"), sorted(JAVA_VECTORS.items()))
def test_java_vectors(data: bytes, want: int) -> None:
    assert murmur2(data) == want
    assert _signed(kp_murmur2(data)) == want


def test_all_tail_lengths_and_buffer_types() -> None:
    data = bytes(range(256)) * 3
    for n in range(0, 70):
        chunk = data[n : n * 2 + 3]
        want = _signed(kp_murmur2(chunk))
        assert murmur2(chunk) == want
        assert murmur2(bytearray(chunk)) == want
        assert murmur2(memoryview(data)[n : n * 2 + 3]) == want


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_matches_kafka_python(data: bytes) -> None:
    assert murmur2(data) == _signed(kp_murmur2(data))
    assert -(1 << 31) <= murmur2(data) < (1 << 31)


def test_default_partition() -> None:
    # Java: Utils.toPositive(Utils.murmur2(key)) % numPartitions
    assert default_partition(b"21", 3) == (-973932308 & 0x7FFFFFFF) % 3
    assert default_partition(b"foobar", 1) == 0
    for key in JAVA_VECTORS:
        for n in (1, 2, 3, 7, 12, 100):
            p = default_partition(key, n)
            assert 0 <= p < n
            assert p == to_positive(JAVA_VECTORS[key]) % n
    assert to_positive(-(1 << 31)) == 0  # unlike abs()
    with pytest.raises(ValueError):
        default_partition(b"x", 0)
