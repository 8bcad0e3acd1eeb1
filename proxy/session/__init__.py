"""One client connection and its upstream: reading, relaying in order, parking, ending.

A session is handed its services (``kproxy.context.SessionServices``) and otherwise
imports only config, metrics, the top-level services (memory, logs, archive) and the
sans-IO core: never ``runtime``, ``http``, ``telemetry`` or ``commands``.
"""
