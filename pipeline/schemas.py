"""Explicit Spark schemas for the archive record streams (schema-on-read).

Telemetry lines follow the OTLP JSON mapping of ``MetricsData`` (camelCase names,
64-bit integers as strings); only the fields the reports use are declared.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)


def _s(*fields: StructField) -> StructType:
    return StructType(list(fields))


def _f(name: str, dtype: object) -> StructField:
    return StructField(name, dtype, True)  # type: ignore[arg-type]


ANY_VALUE = _s(_f("stringValue", StringType()), _f("intValue", StringType()),
               _f("doubleValue", DoubleType()), _f("boolValue", BooleanType()))
KEY_VALUE = _s(_f("key", StringType()), _f("value", ANY_VALUE))
ATTRIBUTES = ArrayType(KEY_VALUE)

NUMBER_POINT = _s(_f("attributes", ATTRIBUTES), _f("timeUnixNano", StringType()),
                  _f("asDouble", DoubleType()), _f("asInt", StringType()))
HISTOGRAM_POINT = _s(_f("attributes", ATTRIBUTES), _f("timeUnixNano", StringType()),
                     _f("count", StringType()), _f("sum", DoubleType()))

METRIC = _s(
    _f("name", StringType()),
    _f("unit", StringType()),
    _f("gauge", _s(_f("dataPoints", ArrayType(NUMBER_POINT)))),
    _f("sum", _s(_f("dataPoints", ArrayType(NUMBER_POINT)),
                 _f("aggregationTemporality", StringType()), _f("isMonotonic", BooleanType()))),
    _f("histogram", _s(_f("dataPoints", ArrayType(HISTOGRAM_POINT)),
                       _f("aggregationTemporality", StringType()))),
)

TELEMETRY_LINE = _s(_f("resourceMetrics", ArrayType(_s(
    _f("resource", _s(_f("attributes", ATTRIBUTES))),
    _f("scopeMetrics", ArrayType(_s(
        _f("scope", _s(_f("name", StringType()), _f("version", StringType()))),
        _f("metrics", ArrayType(METRIC)),
    ))),
))))

CONNECTION = _s(
    _f("ts", DoubleType()), _f("opened", DoubleType()), _f("proxy", StringType()),
    _f("listener", StringType()), _f("client_id", StringType()),
    _f("client_software_name", StringType()), _f("client_software_version", StringType()),
    _f("source_address", StringType()), _f("source_port", LongType()),
    _f("apis", MapType(StringType(), LongType())), _f("metadata_max_version", LongType()),
    _f("supports_metadata_v13", BooleanType()), _f("telemetry", BooleanType()),
    _f("bytes_in", LongType()), _f("bytes_out", LongType()),
)

GROUP_REBALANCE = _s(
    _f("ts", DoubleType()), _f("proxy", StringType()), _f("group", StringType()),
    _f("generation", LongType()), _f("members_before", LongType()),
    _f("members_after", LongType()), _f("duration_s", DoubleType()),
    _f("reason", StringType()), _f("protocol", StringType()), _f("assignor", StringType()),
)
