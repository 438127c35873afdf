"""ApiVersions (18): the versions we support; v3+ bodies come with the v0 response header."""

from __future__ import annotations

from typing import Any

from loglake.broker.protocol import DEFAULT_TABLE, DecodedRequest, api_versions_body


async def handle(ctx: Any, conn: Any, req: DecodedRequest) -> Any:
    return api_versions_body(DEFAULT_TABLE, req.api_version)
