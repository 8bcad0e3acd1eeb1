"""Kafka error codes the proxy reads or writes, by their protocol names.

Values are fixed by the protocol (Kafka's ``Errors`` table); only the codes kproxy
itself produces or reacts to are listed. An ``IntEnum`` so that a decoded
``error_code`` compares and encodes as the plain int it is on the wire.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    NONE = 0
    COORDINATOR_NOT_AVAILABLE = 15
    ILLEGAL_GENERATION = 22
    UNKNOWN_MEMBER_ID = 25
    REBALANCE_IN_PROGRESS = 27
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    UNSUPPORTED_COMPRESSION_TYPE = 76
    INVALID_RECORD = 87
    THROTTLING_QUOTA_EXCEEDED = 89
    FENCED_MEMBER_EPOCH = 110
    UNKNOWN_SUBSCRIPTION_ID = 117
    TELEMETRY_TOO_LARGE = 118
    REBOOTSTRAP_REQUIRED = 129


def error_name(code: int) -> str:
    """The protocol name of ``code``, or ``ERROR_<n>`` for one this table does not list."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"
