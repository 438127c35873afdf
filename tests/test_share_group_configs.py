"""A share group's `share.session.timeout.ms` and `share.heartbeat.interval.ms` (Kafka 4.0's group
configs) against a real broker, which lowers `group.share.min.session.timeout.ms` and
`group.share.min.heartbeat.interval.ms` so that a short session can be waited out:

* DescribeConfigs of the GROUP resource shows them (the broker's `group.share.*` setting until
  set, with it as synonym); IncrementalAlterConfigs takes a value within the broker's
  `group.share.min/max.*` settings and refuses one outside them (INVALID_CONFIG, Kafka's words);
* the ShareGroupHeartbeat answer's heartbeat_interval_ms is the group's, and moves with the config;
* a member silent for longer than the group's session timeout is removed, while a member of a
  group without the config, as silent, stays (the broker's 45 s).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigResource

from loglake.broker.protocol import ApiKey
from loglake.broker.settings import BROKER_SETTINGS
from loglake.kafka_errors import ErrorCode
from test_broker_admin import raw_call
from test_broker_dynamic_configs import alter, describe, describe_raw

from brokerkit import InProcessBroker, serving_in_process

GROUP = ConfigResource.Type.GROUP
SET = AlterConfigOpType.SET
GROUP_CONFIG, DEFAULT_CONFIG = 8, 5  # DescribeConfigs' config sources
MIN_SESSION_MS, MIN_HEARTBEAT_MS = 2_000, 1_000
#: The broker's defaults (BROKER_SETTINGS), which a group without its own configs gets.
SESSION_MS = int(BROKER_SETTINGS["group_share_session_timeout_ms"].default)  # type: ignore[call-overload]
HEARTBEAT_MS = int(BROKER_SETTINGS["group_share_heartbeat_interval_ms"].default)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    root = tmp_path_factory.mktemp("share-configs")
    config = root / "broker.toml"
    config.write_text(f"group_share_min_session_timeout_ms = {MIN_SESSION_MS}\n"
                      f"group_share_min_heartbeat_interval_ms = {MIN_HEARTBEAT_MS}\n")
    with serving_in_process(root / "data", ["--config", str(config)]) as b:
        yield b


@pytest.fixture
def admin(broker: InProcessBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _join(broker: InProcessBroker, group: str, topic: str) -> Any:
    resp = raw_call(broker, ApiKey.SHARE_GROUP_HEARTBEAT, 1, group_id=group, member_id=str(uuid.uuid4()),
                    member_epoch=0, rack_id=None, subscribed_topic_names=[topic])
    assert resp.error_code == ErrorCode.NONE, resp
    return resp


def _members(broker: InProcessBroker, group: str) -> list[str]:
    resp = raw_call(broker, ApiKey.SHARE_GROUP_DESCRIBE, 1, group_ids=[group], include_authorized_operations=False)
    (g,) = resp.groups
    assert g.error_code == ErrorCode.NONE, g
    return [m.member_id for m in g.members]


def test_share_session_and_heartbeat_configs_are_described_and_bounded(admin: AdminClient, broker: InProcessBroker) -> None:
    configs = describe(admin, GROUP, "gs-b")
    assert (configs["share.session.timeout.ms"].value, configs["share.heartbeat.interval.ms"].value) == (
        str(SESSION_MS), str(HEARTBEAT_MS))
    assert configs["share.session.timeout.ms"].is_default
    for name, value, words in (
        ("share.session.timeout.ms", str(MIN_SESSION_MS - 1), "must be greater than or equal to group.share.min.session.timeout.ms"),
        ("share.session.timeout.ms", "60001", "must be less than or equal to group.share.max.session.timeout.ms"),
        ("share.heartbeat.interval.ms", str(MIN_HEARTBEAT_MS - 1), "must be greater than or equal to group.share.min.heartbeat"),
        ("share.heartbeat.interval.ms", "15001", "must be less than or equal to group.share.max.heartbeat"),
        ("share.session.timeout.ms", "lots", "Not a number"),
    ):
        err = alter(admin, GROUP, "gs-b", (name, value, SET))
        assert err is not None and err.code() == KafkaError.INVALID_CONFIG and words in err.str(), (name, err)
    # both within their ranges, but the session not above the heartbeat interval
    err = alter(admin, GROUP, "gs-b", ("share.session.timeout.ms", "3000", SET), ("share.heartbeat.interval.ms", "3000", SET))
    assert err is not None and "share.session.timeout.ms must be greater than share.heartbeat.interval.ms" in err.str()
    assert alter(admin, GROUP, "gs-b", ("share.session.timeout.ms", "3000", SET), ("share.heartbeat.interval.ms", "1500", SET)) is None
    raw = describe_raw(broker, 32, "gs-b", ["share.session.timeout.ms", "share.heartbeat.interval.ms"]).configs
    assert [(c.name, c.value, c.config_source, [(s.name, s.value, s.source) for s in c.synonyms]) for c in raw] == [
        ("share.session.timeout.ms", "3000", GROUP_CONFIG,
         [("share.session.timeout.ms", "3000", GROUP_CONFIG), ("group.share.session.timeout.ms", str(SESSION_MS), DEFAULT_CONFIG)]),
        ("share.heartbeat.interval.ms", "1500", GROUP_CONFIG,
         [("share.heartbeat.interval.ms", "1500", GROUP_CONFIG),
          ("group.share.heartbeat.interval.ms", str(HEARTBEAT_MS), DEFAULT_CONFIG)]),
    ]


def test_a_share_groups_heartbeat_interval_and_session_timeout_are_its_own(admin: AdminClient, broker: InProcessBroker) -> None:
    topic = "share-cfg"
    raw_call(broker, ApiKey.CREATE_TOPICS, 7, topics=[{"name": topic, "num_partitions": 1, "replication_factor": 1,
                                                      "assignments": [], "configs": []}],
             timeout_ms=15_000, validate_only=False)
    assert alter(admin, GROUP, "gs-short", ("share.session.timeout.ms", "3000", SET),
                 ("share.heartbeat.interval.ms", "1000", SET)) is None
    short = _join(broker, "gs-short", topic)
    assert short.heartbeat_interval_ms == 1000
    plain = _join(broker, "gs-plain", topic)
    assert plain.heartbeat_interval_ms == HEARTBEAT_MS
    assert alter(admin, GROUP, "gs-short", ("share.session.timeout.ms", "3000", SET),
                 ("share.heartbeat.interval.ms", "1200", SET)) is None
    assert _join(broker, "gs-short", topic).heartbeat_interval_ms == 1200  # the change holds at once
    # both stay silent: the short group's members go after its 3 s, the other's stays
    started = time.monotonic()
    while _members(broker, "gs-short") and time.monotonic() - started < 30:
        time.sleep(0.2)
    gone_after = time.monotonic() - started
    assert _members(broker, "gs-short") == []
    assert 1.5 < gone_after < 10, gone_after  # ~3 s of silence (the second member joined ~now), not 45
    assert _members(broker, "gs-plain") == [plain.member_id]
