"""Per-API message schemas, written as data for ``kproxy.codecs.interpreter``.

Field names are the Kafka message-definition names in snake_case; versions are
the ranges in which each field exists on the wire.
"""
