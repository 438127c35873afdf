"""SaslHandshake (17) and SaslAuthenticate (36); the state machine is loglake.broker.security.sasl's."""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.security.sasl import TOKEN_STATES, SaslError, SaslSession, SaslState
from loglake.kafka_errors import ErrorCode


async def sasl_handshake(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    session = conn.sasl
    enabled = list(ctx.sasl.mechanisms)
    if session is None:  # a listener without SASL: nothing to hand shake about (Kafka's answer)
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": enabled}
    limited, where = conn.limited, conn.security.listener.name
    if req.api_version == 0:
        limited.warning(
            ("sasl_v0", conn.peer_host),
            "closing %s: SaslHandshake v0 on the %s listener asks for raw SASL tokens (clients before "
            "Kafka 1.0); loglake supports SaslHandshake v1 with SaslAuthenticate only",
            conn.peer,
            where,
        )
        conn.close_after_write = 0.0
        return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "mechanisms": enabled}
    mechanism = str(req.body.mechanism)
    if session.state is SaslState.DONE:  # KIP-368: re-authentication, with the same mechanism
        if mechanism != session.mechanism:
            limited.warning(
                ("sasl_mechanism", conn.peer_host),
                "closing %s: re-authentication with SASL mechanism %r on the %s listener; the session used %s",
                conn.peer,
                mechanism[:64],
                where,
                session.mechanism,
            )
            conn.close_after_write = 0.0
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": [session.mechanism]}
        session.begin_reauthentication()
        return {"error_code": ErrorCode.NONE, "mechanisms": enabled}
    if session.state is not SaslState.HANDSHAKE:
        limited.warning(
            ("sasl_state", conn.peer_host),
            "closing %s: SaslHandshake in SASL state %s on the %s listener",
            conn.peer,
            session.state,
            where,
        )
        conn.close_after_write = 0.0
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": enabled}
    if mechanism not in enabled:
        limited.warning(
            ("sasl_mechanism", conn.peer_host),
            "closing %s: SASL mechanism %r is not enabled on the %s listener (sasl_enabled_mechanisms: %s)",
            conn.peer,
            mechanism[:64],
            where,
            ",".join(enabled),
        )
        conn.close_after_write = 0.0
        return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled}
    session.mechanism = mechanism
    session.transition_to(SaslState.AUTHENTICATE)
    return {"error_code": ErrorCode.NONE, "mechanisms": enabled}


async def sasl_authenticate(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    session = conn.sasl
    if session is None:
        return {
            "error_code": ErrorCode.ILLEGAL_SASL_STATE,
            "error_message": "SaslAuthenticate on a listener without SASL",
            "auth_bytes": b"",
            "session_lifetime_ms": 0,
        }
    async with session.turn:  # a pipelined one waits, then sees the state this one leaves
        return await _authenticate(ctx, conn, req, session)


async def _authenticate(ctx: BrokerContext, conn: Conn, req: DecodedRequest, session: SaslSession) -> dict[str, object]:
    if session.state not in TOKEN_STATES:
        conn.limited.warning(
            ("sasl_state", conn.peer_host),
            "closing %s: SaslAuthenticate in SASL state %s on the %s listener",
            conn.peer,
            session.state,
            conn.security.listener.name,
        )
        if conn.close_after_write is None:  # after a failure its delay stays: pipelining does not shorten it
            conn.close_after_write = 0.0
        what = "before SaslHandshake" if session.state is SaslState.HANDSHAKE else "after authentication finished"
        return {
            "error_code": ErrorCode.ILLEGAL_SASL_STATE,
            "error_message": f"Unexpected SaslAuthenticate {what}",
            "auth_bytes": b"",
            "session_lifetime_ms": 0,
        }
    try:
        answer = await session.step(ctx.sasl, bytes(req.body.auth_bytes or b""))
    except SaslError as exc:
        message = session.failed(ctx.sasl, exc)
        return {
            "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED,
            "error_message": message,
            "auth_bytes": b"",
            "session_lifetime_ms": 0,
        }
    # KIP-368: the client re-authenticates within it; 0 when connections_max_reauth_ms is off.
    return {
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "auth_bytes": answer,
        "session_lifetime_ms": session.session_lifetime_ms,
    }


HANDLERS: dict[int, Handler] = {
    ApiKey.SASL_HANDSHAKE: sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: sasl_authenticate,
}
