"""Sans-IO Kafka wire codecs: bytes in, plain Python objects out, and back.

Nothing in this package imports trio or touches a socket; the proxy shell feeds it
bytes and sends what it returns.
"""

from kproxy.codecs.errors import CodecError

__all__ = ["CodecError"]
