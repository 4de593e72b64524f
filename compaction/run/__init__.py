"""One compaction run, as plan → stage → commit (the shape of `compaction.gc`: plan, execute, report).

- `plan.py`: reads the metadata table once (and each partition's producer state and aborted transactions, once)
  and returns a frozen `RunPlan` recording the table version and the clock. A dry run renders it and stops.
- `stage.py`: takes ownership of every eligible partition (new fencing epochs, one commit), runs the Spark data path
  (`compaction.spark.pipeline`) and uploads every output under a fresh id. Nothing is visible yet.
- `commit.py`: lands every partition's swap in one metadata commit, each checked alone, and returns the outcomes.
- `producers.py`: producer state from the tier. The small picklable values shipped to executors are
  `compaction.tasks`, below run/, spark/ and rewrite/, which all read them.
- `stats.py` (a partition's counters), `report.py` (the typed `RunReport`, its text and JSON), `report_html.py`
  and `metrics.py` (the same report as an HTML page and a Prometheus file).

The public API (`compaction.plan`, `stage`, `commit`, `compact`) and the CLI call these. Every step is safe to
rerun. This package imports no pyspark until `stage` runs.
"""
