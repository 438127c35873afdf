"""Garbage and mutated requests into decode_request raise only the codec's typed errors."""

from __future__ import annotations

import random
import struct
import time

from loglake.broker.protocol import DecodedRequest, ProtocolError, decode_request
from test_protocol_samples import all_versions, client_bytes, sample_request

CASES = 6000


def _seeds() -> list[bytes]:
    frames = []
    for api_key, version in all_versions():
        req = sample_request(api_key, version, seed=7)
        frames.append(client_bytes(req, correlation_id=3)[4:])
    return frames


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and b:  # flip a byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:  # truncate
            del b[rng.randrange(len(b)) :]
        elif op == 2:  # append junk
            b += rng.randbytes(rng.randint(1, 8))
        elif op == 3 and len(b) > 8:  # big/negative length somewhere after the header
            pos = rng.randrange(8, len(b))
            val = rng.choice([-2, -1, 0x7FFF, 0x7FFFFFFF, -(2**31)])
            fmt = rng.choice([">h", ">i"])
            packed = struct.pack(fmt, max(min(val, 0x7FFF), -0x8000) if fmt == ">h" else val)
            b[pos : pos + len(packed)] = packed
        elif op == 4 and len(b) > 8:  # long varint continuation run
            pos = rng.randrange(8, len(b))
            b[pos:pos] = b"\xff" * rng.randint(1, 9)
        elif op == 5 and len(b) > 8:  # delete a span
            pos = rng.randrange(8, len(b))
            del b[pos : pos + rng.randint(1, 6)]
        elif op == 6 and len(b) > 8:  # invalid UTF-8
            pos = rng.randrange(8, len(b))
            b[pos : pos + 2] = b"\xc3\x28"
    return bytes(b)


def _check(frame: bytes) -> None:
    try:
        result = decode_request(frame)
    except ProtocolError:
        return
    assert isinstance(result, DecodedRequest)


def test_random_garbage() -> None:
    rng = random.Random(1234)
    t0 = time.perf_counter()
    for _ in range(CASES // 3):
        n = rng.choice([0, 1, 7, 8, 9, 12, 20, 64, 300])
        frame = rng.randbytes(n)
        if n >= 4 and rng.random() < 0.7:  # a served api key so the body decoders run
            key = rng.choice([0, 1, 2, 3, 8, 9, 10, 11, 18, 19, 32, 60])
            frame = struct.pack(">hh", key, rng.randint(0, 18)) + frame[4:]
        _check(frame)
    assert time.perf_counter() - t0 < 10


def test_mutated_valid_requests() -> None:
    rng = random.Random(99)
    seeds = _seeds()
    t0 = time.perf_counter()
    for _ in range(CASES):
        _check(_mutate(rng, rng.choice(seeds)))
    assert time.perf_counter() - t0 < 10
