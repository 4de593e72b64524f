"""POLICY: which record wins its key, and what a batch retains (Kafka's cleaner rules: docs/cleaner-rules.md).

The modules here decide; `compaction.rewrite` carries the decisions out on bytes. Nothing here reads
segments, clocks or configuration files: every input is a value.
"""
