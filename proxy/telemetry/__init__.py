"""KIP-714 termination: the push and subscription service, its /metrics side, the
pacing of decode work, and OTLP/HTTP export.
"""
