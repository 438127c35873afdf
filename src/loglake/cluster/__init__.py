"""Cluster mode: brokers over one bucket, coordinated through etcd (docs/CLUSTER.md).

`membership` registers a broker under an etcd lease and follows the live set; `assign` spreads
partitions over the live brokers. The metadata itself lives in loglake.meta.etcd.
"""
