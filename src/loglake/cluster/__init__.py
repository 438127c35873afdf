"""Cluster mode: brokers over one bucket, coordinated through etcd (docs/CLUSTER.md).

`membership` registers a broker under an etcd lease and follows the live set; `assign` spreads
partitions over the live brokers. The metadata itself lives in loglake.cluster.etcd.
Durability class `object`: `flushobj` is the shared flush object's format (many partitions'
batches, one PUT), `flusher` the buffer that writes them and acknowledges after a commit
callback, `merge` the background rewrite into ordinary sealed segments.
"""
