"""kproxy: a Kafka-protocol-aware proxy on trio.

``kproxy`` (this folder, ``proxy/``) holds all I/O; the sans-IO protocol core is in
``kproxy.codecs`` (``codecs/``) and the decisions in ``kproxy.policies``
(``policies/``).
"""

__version__ = "0.1.0"
