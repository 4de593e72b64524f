"""POLICY: which record wins its key, and what a batch retains (spec §3.7-3.10).

The modules here decide; `compaction.rewrite` carries the decisions out on bytes. Nothing here reads
segments, clocks or configuration files: every input is a value.
"""
