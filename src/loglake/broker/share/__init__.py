"""Share groups (KIP-932, "queues for Kafka"): membership, share-partitions, share sessions.

Beside `loglake.broker.groups` (consumer groups) and shaped like it: `states` (the record states
and acknowledge types, one table each), `limits` (every bound, by Kafka's setting names),
`partition` (one share-partition's in-flight records: a pure state machine), `store` (a narrow
interface over `engine.meta`, so cluster mode stores through etcd), `coordinator` (members by
heartbeat, share sessions, the share-partitions this broker leads). docs/SHARE_GROUPS.md says
what is supported.
"""

from loglake.broker.share.coordinator import ShareCoordinator
from loglake.broker.share.limits import ShareLimits

__all__ = ["ShareCoordinator", "ShareLimits"]
