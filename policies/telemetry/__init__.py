"""Client telemetry (KIP-714) decisions and state: subscriptions, each client
instance's pacing, and the metric series pushes become."""
