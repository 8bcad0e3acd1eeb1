"""The one error type every decoder in this package raises on malformed input."""

from __future__ import annotations


class CodecError(ValueError):
    """Malformed or unsupported bytes.

    ``what`` names the field being decoded (a dotted path such as
    ``MetadataResponse.brokers[2].host``) and ``offset`` the byte position in the
    buffer where the fault was found, so that an operator can find it in a hex dump.
    """

    def __init__(self, reason: str, *, what: str = "", offset: int | None = None) -> None:
        self.reason = reason
        self.what = what
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.reason]
        if self.what:
            parts.append(f"while decoding {self.what}")
        if self.offset is not None:
            parts.append(f"at offset {self.offset}")
        return " ".join(parts)

    def within(self, what: str) -> CodecError:
        """Return a copy whose path is prefixed by an enclosing field name."""
        sep = "" if self.what.startswith("[") else "."
        path = f"{what}{sep}{self.what}" if self.what else what
        return CodecError(self.reason, what=path, offset=self.offset)
