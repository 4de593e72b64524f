"""`python -m compaction.cli`: the `kcompact` console script."""

from compaction.cli import run

run()
