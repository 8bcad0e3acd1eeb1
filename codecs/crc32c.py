"""CRC-32C (Castagnoli), the checksum Kafka uses for record batches.

Pure Python and table-driven; the proxy computes it only over short strings
(telemetry subscription ids), never over record data.
"""

from __future__ import annotations

_POLY = 0x82F63B78


def _table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _table()


def crc32c(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
