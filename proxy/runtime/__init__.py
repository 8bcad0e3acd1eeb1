"""The running proxy: wiring, listeners, admission, upstream, TLS, discovery, workers.

The one place that owns every service; it hands sessions their ``SessionServices``.
"""
