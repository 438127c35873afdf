"""The transaction coordinator (docs/TRANSACTIONS.md)."""

from loglake.broker.txn.coordinator import Txn, TxnCoordinator, TxnSettings

__all__ = ["Txn", "TxnCoordinator", "TxnSettings"]
