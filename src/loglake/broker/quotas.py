"""Former place of `loglake.broker.security.quotas`, kept only for handlers/fetch.py while another
change edits it: its import moves to the security package with it, and this module goes."""

from loglake.broker.security.quotas import CONSUMER_BYTE_RATE

__all__ = ["CONSUMER_BYTE_RATE"]
