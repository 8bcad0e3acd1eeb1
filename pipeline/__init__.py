"""PySpark jobs over archived telemetry."""
