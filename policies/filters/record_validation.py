"""``type = "record-validation"``: refuse Produce batches whose records are not valid JSON
(or break a JSON Schema), per partition, the way a broker refuses an invalid record.

Each partition of a matched topic is checked record by record. A partition holding an
invalid record gets INVALID_RECORD (87) with KIP-467's ``record_errors`` (the record's
index in its batch and why) and ``error_message``; nothing of that batch is written.
The other partitions are forwarded: the request is written again without the refused
ones, and the broker's response gets their entries back, in request order. When every
partition is refused the proxy answers alone; with ``acks=0`` (no response to carry
the error) any refusal closes the connection, as a broker does.

Compressed batches are decompressed within ``max_decompressed_bytes`` (a bomb is
refused at that bound, never expanded past it). Null keys and values (tombstones) are
not checked. Produce v13 names topics by id only: the filter reads v0-12, so the proxy
caps Produce at v12 in ApiVersions while this filter is configured.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from kproxy.codecs import api_keys
from kproxy.codecs.compression import DecompressionLimitExceeded
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.produce_request import ProduceRequest, walk, without
from kproxy.codecs.record_batch import iter_records
from kproxy.codecs.schema import Versions
from kproxy.policies.connection import (
    Answer,
    Close,
    ConnectionState,
    Forward,
    RequestDecision,
)
from kproxy.policies.filters.api import Filter, FilterConfigError

MAX_RECORD_ERRORS = 100  # per partition, as listed in the response
MAX_MESSAGE = 200  # characters of one error message
DEFAULT_MAX_DECOMPRESSED = 16 * 1024 * 1024
# Produce v13 sends topic ids, which cannot be matched against topic patterns.
PRODUCE_VERSIONS = Versions(0, 12)

Check = Callable[[bytes | memoryview], str | None]  # None: valid; else why not


def json_check(validator: Any | None) -> Check:
    """Syntax only (``validator`` None), or syntax then the schema."""

    def check(data: bytes | memoryview) -> str | None:
        try:
            doc = json.loads(bytes(data))
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            return f"not valid JSON: {exc}"
        if validator is None or validator.is_valid(doc):
            return None
        err = best_match(validator.iter_errors(doc))
        return f"{err.json_path}: {err.message}"

    return check


def load_schema(key: str, path: Path) -> Any:
    """A validator for the JSON Schema in ``path`` (its dialect from ``$schema``)."""
    try:
        schema = json.loads(path.read_text())
    except OSError as exc:
        raise FilterConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise FilterConfigError(key, f"{path} is not JSON: {exc}") from None
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise FilterConfigError(key, f"{path} is not a valid JSON Schema: "
                                f"{exc.message}") from None
    return cls(schema)


class RecordValidation(Filter):
    kind = "record-validation"

    def __init__(self, *, topics: list[str], value_check: Check | None = None,
                 key_check: Check | None = None,
                 max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
                 summary: str = "") -> None:
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise FilterConfigError("topics", "a non-empty list of topic patterns is needed")
        if value_check is None and key_check is None:
            raise FilterConfigError("value_format", "set value_schema or value_format "
                                    "(and/or key_schema or key_format)")
        self.patterns = list(topics)
        self.matches = re.compile("|".join(fnmatch.translate(t) for t in topics)).match
        self.value_check = value_check
        self.key_check = key_check
        self.max_decompressed_bytes = max_decompressed_bytes
        self.summary = summary
        self.requests = {api_keys.PRODUCE: PRODUCE_VERSIONS}

    @classmethod
    def from_config(cls, options: Mapping[str, Any], base: Path) -> RecordValidation:
        """From a ``[[filters]]`` table; schema paths are relative to the config file."""
        opts = dict(options)
        topics = opts.pop("topics", None)
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, list):
            raise FilterConfigError("topics", "a list of topic patterns is needed")
        checks: dict[str, Check | None] = {}
        said = []
        for part in ("value", "key"):
            schema, fmt = opts.pop(f"{part}_schema", None), opts.pop(f"{part}_format", None)
            if schema is not None and fmt is not None:
                raise FilterConfigError(f"{part}_schema", f"set {part}_schema or "
                                        f"{part}_format, not both")
            if fmt is not None and fmt != "json":
                raise FilterConfigError(f"{part}_format", f"expected \"json\", got {fmt!r}")
            if schema is not None:
                if not isinstance(schema, str):
                    raise FilterConfigError(f"{part}_schema", "expected a file path")
                checks[part] = json_check(load_schema(f"{part}_schema", base / schema))
                said.append(f"{part}s against {schema}")
            elif fmt is not None:
                checks[part] = json_check(None)
                said.append(f"{part}s are JSON")
        limit = opts.pop("max_decompressed_bytes", DEFAULT_MAX_DECOMPRESSED)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            raise FilterConfigError("max_decompressed_bytes", f"must be a positive integer, "
                                    f"got {limit!r}")
        if opts:
            raise FilterConfigError(sorted(opts)[0], "unknown key for record-validation")
        return cls(topics=topics, value_check=checks.get("value"),
                   key_check=checks.get("key"), max_decompressed_bytes=limit,
                   summary=f"{', '.join(said)} on topics {', '.join(topics)}")

    def describe(self) -> str:
        return self.summary

    # ------------------------------------------------------------------ requests

    def on_request(self, conn: ConnectionState, peek: RequestPeek,
                   body: memoryview) -> RequestDecision:
        req = walk(body)
        refused: dict[tuple[int, int], dict[str, Any]] = {}
        for t, topic in enumerate(req.topics):
            if topic.topic is None or not self.matches(topic.topic):
                continue
            for p, part in enumerate(topic.partitions):
                errors = self.check(part.records)
                if errors:
                    refused[(t, p)] = refusal(part.index, errors)
        if not refused:
            return None
        return refuse_partitions(body, peek, req, refused, Close(
            "invalid record with acks=0", "invalid_record", "a Produce with acks=0 held an "
            "invalid record: connection closed (a broker does the same; acks=0 has no "
            "response to carry the error)", "Produce"))

    def check(self, records: memoryview | None) -> list[tuple[int, str]]:
        """The invalid records of a partition: (index in batch, why); [] when all pass."""
        if records is None:
            return []
        errors: list[tuple[int, str]] = []
        try:
            for rec in iter_records(records, self.max_decompressed_bytes):
                why = None
                if self.value_check is not None and rec.value is not None:
                    why = self.value_check(rec.value)
                    why = why and f"value {why}"
                if why is None and self.key_check is not None and rec.key is not None:
                    why = self.key_check(rec.key)
                    why = why and f"key {why}"
                if why is not None:
                    errors.append((rec.index, why[:MAX_MESSAGE]))
                    if len(errors) >= MAX_RECORD_ERRORS:
                        break
        except DecompressionLimitExceeded as exc:
            return [(0, f"batch refused: {exc} (max_decompressed_bytes)"[:MAX_MESSAGE])]
        except CodecError as exc:
            return [(0, f"batch unreadable: {exc}"[:MAX_MESSAGE])]
        return errors


def refusal(index: int, errors: list[tuple[int, str]]) -> dict[str, Any]:
    """A partition's INVALID_RECORD entry with KIP-467's record errors."""
    first = errors[0][1]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return {"index": index, "error_code": ErrorCode.INVALID_RECORD, "base_offset": -1,
            "log_append_time_ms": -1, "log_start_offset": -1,
            "record_errors": [{"batch_index": i, "batch_index_error_message": m}
                              for i, m in errors],
            "error_message": f"record {errors[0][0]}: {first}{more}"[:MAX_MESSAGE]}


def refuse_partitions(body: memoryview, peek: RequestPeek, req: ProduceRequest,
                      refused: dict[tuple[int, int], dict[str, Any]],
                      acks0: Close) -> RequestDecision:
    """A Produce some of whose partitions a filter refused (``refused``: by (topic,
    partition) position, the entry to answer): the rest forwarded and the responses
    merged, the whole answered here when nothing is left, ``acks0`` when no response
    could carry the errors."""
    if req.acks == 0:
        return acks0
    # What the response needs of the request, without views into its buffer (held
    # until the response, they would pin the connection's receive buffer).
    plan = Plan(req.api_version, req.correlation_id,
                [(topic.topic, [part.index for part in topic.partitions])
                 for topic in req.topics], refused)
    if len(refused) == sum(len(topic.partitions) for topic in req.topics):
        return Answer(plan.response(None))
    return Forward(without(body, req, set(refused)), peek.api_version,
                   lambda resp, version: plan.response(resp))


@dataclass(frozen=True, slots=True)
class Plan:
    """A Produce request's topics and partitions in order, and the refused entries."""

    api_version: int
    correlation_id: int
    order: list[tuple[str | None, list[int]]]
    refused: dict[tuple[int, int], dict[str, Any]]

    def response(self, broker: memoryview | None) -> bytes:
        """The client's Produce response: the broker's entries (if any) and the refused
        ones, topic by topic and partition by partition in the order of the request."""
        version = self.api_version
        body: dict[str, Any] = {"responses": [], "throttle_time_ms": 0}
        tags = None
        theirs: dict[tuple[str, int], dict[str, Any]] = {}
        if broker is not None:
            resp = decode_response(broker, api_keys.PRODUCE, version)
            body, tags = resp.body, resp.header.tagged
            for topic in body["responses"]:
                for entry in topic["partition_responses"]:
                    theirs[(topic["name"], entry["index"])] = entry
        merged = []
        for t, (name, partitions) in enumerate(self.order):
            entries = []
            for p, index in enumerate(partitions):
                entry = self.refused.get((t, p)) or theirs.pop((str(name), index), None)
                if entry is not None:
                    entries.append(entry)
            merged.append({"name": name, "partition_responses": entries})
        for (name, _), entry in theirs.items():  # none expected: whatever else it said
            merged.append({"name": name, "partition_responses": [entry]})
        body["responses"] = merged
        return encode_response_parts(api_keys.PRODUCE, version, self.correlation_id, body,
                                     tags)
