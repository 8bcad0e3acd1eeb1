"""The archive's record formats, shared by the writer (proxy) and the reader (pipeline).

One JSON object per line. ``ConnectionRecord`` is the inventory record written when a
client connection closes; the Spark schema in ``pipeline/schemas.py`` reads the same
fields, and ``tests/e2e/test_pipeline.py`` checks that the two agree field by field.
"""

from __future__ import annotations

from typing import TypedDict


class ConnectionRecord(TypedDict):
    ts: float  # when the connection closed (Unix seconds)
    opened: float
    proxy: str  # the proxy's host name
    listener: str
    client_id: str | None
    client_software_name: str | None
    client_software_version: str | None
    source_address: str
    source_port: int
    apis: dict[str, int]  # API name -> highest version used
    metadata_max_version: int | None
    supports_metadata_v13: bool | None
    telemetry: bool
    bytes_in: int
    bytes_out: int
