"""JSON message schemas that kafka-python 3.0.12 lacks, written for loglake from Kafka's field lists.

kafka-python's message classes load their schema by class name from a package; `kip848.py` points
its classes here (``class X(ApiMessage, load_json=schemas)``). The files follow the layout of
Kafka's message JSON (name, validVersions, flexibleVersions, fields) without comments.
"""
