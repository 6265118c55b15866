"""Datasets: task generation (numpy, keyed by seed and task id), the Parquet schema, shards
with checksums and manifests, and their Ray Data generation stage (``generate``)."""
