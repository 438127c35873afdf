"""The Kafka wire-protocol broker: `loglake serve`.

`protocol/` is the sans-IO codec (bytes in, requests out); `server.py` is the asyncio shell
(sockets, framing limits, ordering, shutdown); `handlers/` holds one module per Kafka API;
`groups/` is the consumer-group coordinator.
"""
