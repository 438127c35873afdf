"""Former place of `loglake.broker.security.authorized`, kept only for handlers/fetch.py and
handlers/produce.py while another change edits them: their imports move to the security package
with it, and this module goes."""

from loglake.broker.security.authorized import TOPIC, TRANSACTIONAL_ID, AclOperation, check, denied

__all__ = ["TOPIC", "TRANSACTIONAL_ID", "AclOperation", "check", "denied"]
