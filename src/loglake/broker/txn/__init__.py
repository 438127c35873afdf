"""The transaction coordinator (docs/TRANSACTIONS.md)."""

from loglake.broker.txn.coordinator import Txn, TxnBackend, TxnCoordinator, TxnSettings

__all__ = ["Txn", "TxnBackend", "TxnCoordinator", "TxnSettings"]
