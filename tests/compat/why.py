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
    "kafka-python-2.0.2": (
        "tansu answers a JoinGroup v2 request with MEMBER_ID_REQUIRED (79). Kafka sends that "
        "error only at JoinGroup v4 and later (KIP-394), to clients that know to re-join with "
        "the member id it hands out; kafka-python 2.0.2 speaks JoinGroup v2, maps 79 to "
        "`UnknownError` and never joins the group, so it cannot consume in a group (topic "
        "creation and produce work). kproxy relays JoinGroup untouched and does not fix this: "
        "it would have to run the re-join on the client's behalf."),
    "kafka-python-3.0.12": (
        "Everything but describing the group works. kafka-python 3.0.12 always asks "
        "DescribeGroups for the group's authorized operations and turns the bit field into "
        "its `ACLOperation` enum, which stops at 14; tansu's answer has bit 15 set "
        "(TWO_PHASE_COMMIT, an operation that does not apply to groups), so the client raises "
        "`ValueError: 15 is not a valid ACLOperation`. kproxy relays DescribeGroups untouched "
        "and does not fix this."),
    "confluent-kafka-1.9.2": (
        "Not a backend problem: confluent-kafka 1.9.2 ships no wheel for Python 3.11 (the "
        "only Python here; its first cp311 wheels are 2.0.2), and a build from source would "
        "link this machine's librdkafka (Debian's 2.0.2) rather than the 1.9.2 that release "
        "bundles, so it would not test that client. Debian's kcat covers a librdkafka of "
        "that age (2.0.2)."),
}
