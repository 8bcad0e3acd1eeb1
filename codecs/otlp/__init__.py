"""OTLP metrics payloads (KIP-714 pushes): the plain model, the bounded stepped
decoder, the fast path for small canonical payloads, and export bodies.
"""
