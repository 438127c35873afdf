"""ApiVersions (18): the versions we support; v3+ bodies come with the v0 response header."""

from __future__ import annotations

from typing import Any

from loglake.broker.protocol import DecodedRequest, api_versions_body


async def handle(ctx: Any, conn: Any, req: DecodedRequest) -> Any:
    from loglake.broker.handlers import ADVERTISED  # built after every handler registered

    return api_versions_body(ADVERTISED, req.api_version)
