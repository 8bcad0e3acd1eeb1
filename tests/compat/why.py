"""Why a client fails against the backend directly: what the backend does wrong.

Keyed by client slug (or driver); report.py adds whether kproxy fixes it from the run.
"""

from __future__ import annotations

EXPLANATIONS: dict[str, str] = {
    "kcat": (
        "tansu writes all four ApiVersions v3 tagged fields (SupportedFeatures=[], "
        "FinalizedFeaturesEpoch=-1, FinalizedFeatures=[], ZkMigrationReady=false) although "
        "each equals its default, which Kafka's own encoder never does. librdkafka 2.0.2 "
        "mis-skips them and reports `ApiVersionRequest failed: Local: Read underflow`, so "
        "the client never gets past its first request. kproxy decodes and re-encodes every "
        "ApiVersions response anyway and writes Kafka's canonical form, tagged fields at "
        "their default left out (`codecs/canonical.py`)."),
}
