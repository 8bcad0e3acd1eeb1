"""Walking a Fetch response as its bytes pass, without ever holding it whole.

A Fetch v16+ response may end with NodeEndpoints (KIP-951) in its top-level tagged
section, which the proxy must rewrite; everything before it is the response's
skeleton (topics, partition heads, tag sections) around the records, which are most
of its bytes and which nobody reads. ``FetchWalk`` follows the skeleton in whatever
pieces the bytes come in and says, at each point, what comes next: skeleton bytes
to look at, a run of opaque bytes (records, tag values) that may go on unseen (the
proxy splices them socket to socket), or the top-level tagged section, the tail.

Sans-IO: the caller feeds bytes (``advance``) and reports opaque bytes passed
(``skip``). A malformed response raises ``CodecError`` at the first byte that cannot
be right; the walk never reads past the frame's size.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Generator
from typing import Any

from kproxy.codecs.errors import CodecError
from kproxy.codecs.skipping import uvarint_at

FIRST_VERSION, LAST_VERSION = 12, 18  # flexible Fetch responses of this layout

_FIXED, _VARINT, _SKIP, _TAIL = range(4)
_PARTITION_HEAD = struct.Struct(">ihq")  # index, error_code, high_watermark
_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8  # ... last_stable_offset, log_start_offset
_MAX_NAME = 32767  # an int16-sized string

Need = tuple[int, int]
# (topic id or name, partition index, error code, high watermark) of each partition.
PartitionHead = tuple[uuid.UUID | str, int, int, int]


class FetchWalk:
    """Where a Fetch response body (correlation id first) of ``size`` bytes stands."""

    __slots__ = ("_need", "_steps", "at_tail", "heads", "opaque", "pos", "size", "version")

    def __init__(self, version: int, size: int) -> None:
        if not knows(version):
            raise CodecError(f"Fetch v{version} is not walked as it passes", what="Fetch")
        self.version = version
        self.size = size
        self.pos = 0  # bytes of the body walked or skipped
        self.opaque = 0  # opaque bytes to pass before the walk goes on
        self.at_tail = False  # what is left of the body is the top-level tagged section
        self.heads: list[PartitionHead] = []
        self._steps = self._walk()
        self._need: Need = (_FIXED, 0)
        self._next(None)  # the first need

    @property
    def tail_size(self) -> int:
        return self.size - self.pos

    def advance(self, buf: memoryview) -> int:
        """Walk the skeleton at the start of ``buf`` (the body's bytes from ``pos``);
        how many it used. It stops at opaque bytes (``opaque``), at the tail
        (``at_tail``), or where ``buf`` ends inside an item (give it more)."""
        used, end = 0, len(buf)
        while not (self.opaque or self.at_tail):
            kind, n = self._need
            if kind == _FIXED:
                if end - used < n:
                    break
                value: Any = buf[used : used + n]
                used += n
            else:
                value, after = uvarint_at(buf, used, end)
                if after > end:
                    if end - used >= 5:
                        raise CodecError("varint longer than 5 bytes", what="FetchResponse",
                                         offset=self.pos + used)
                    break
                used = after
            if self.pos + used > self.size:
                raise CodecError("response ends inside its structure", what="FetchResponse",
                                 offset=self.size)
            self._next(value, self.pos + used)
        self.pos += used
        return used

    def skip(self, n: int) -> None:
        """``n`` opaque bytes (at most ``opaque``) went on unseen."""
        assert 0 < n <= self.opaque
        self.opaque -= n
        self.pos += n
        if not self.opaque:
            self._next(None)

    def _next(self, value: object, at: int = -1) -> None:
        kind, n = self._need = self._steps.send(value)
        if kind in (_SKIP, _TAIL):
            at = self.pos if at < 0 else at
            if kind == _SKIP:
                if n > self.size - at:
                    raise CodecError(f"{n} bytes run past the response's end",
                                     what="FetchResponse", offset=at)
                self.opaque = n
            else:
                if at >= self.size:
                    raise CodecError("no top-level tagged fields", what="FetchResponse",
                                     offset=at)
                self.at_tail = True

    def _count(self, value: int, at_least: int) -> int:
        """An array's length from its compact encoding; -1 for null."""
        n = value - 1
        if n * at_least > self.size:
            raise CodecError(f"array of {n} items cannot fit", what="FetchResponse")
        return n

    def _walk(self) -> Generator[Need, Any, None]:
        yield (_FIXED, 4)  # correlation id
        yield from _tags()  # the response header's
        yield (_FIXED, 4 + 2 + 4)  # throttle_time_ms, error_code, session_id
        topics = self._count(int((yield (_VARINT, 0))), 2)
        for _ in range(max(topics, 0)):
            topic: uuid.UUID | str
            if self.version >= 13:
                topic = uuid.UUID(bytes=bytes((yield (_FIXED, 16))))
            else:
                length = int((yield (_VARINT, 0))) - 1
                if not 0 <= length <= _MAX_NAME:
                    raise CodecError(f"topic name of length {length}", what="FetchResponse")
                name = bytes((yield (_FIXED, length)))
                topic = name.decode("utf-8", "replace")
            partitions = self._count(int((yield (_VARINT, 0))), _PARTITION_FIXED)
            for _ in range(max(partitions, 0)):
                head = yield (_FIXED, _PARTITION_FIXED)
                index, error, hwm = _PARTITION_HEAD.unpack_from(head)
                self.heads.append((topic, index, error, hwm))
                aborted = self._count(int((yield (_VARINT, 0))), 17)
                for _ in range(max(aborted, 0)):
                    yield (_FIXED, 16)  # producer_id, first_offset
                    yield from _tags()
                yield (_FIXED, 4)  # preferred_read_replica
                records = int((yield (_VARINT, 0))) - 1
                if records > 0:
                    yield (_SKIP, records)
                yield from _tags()
            yield from _tags()
        yield (_TAIL, 0)


def _tags() -> Generator[Need, Any, None]:
    """A tagged section: its values are passed as opaque bytes."""
    count = int((yield (_VARINT, 0)))
    for _ in range(count):
        yield (_VARINT, 0)  # the tag
        size = int((yield (_VARINT, 0)))
        if size:
            yield (_SKIP, size)


def knows(version: int) -> bool:
    return FIRST_VERSION <= version <= LAST_VERSION
