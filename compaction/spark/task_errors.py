"""kcompact's own errors raised in a Spark task, raised again on the driver as themselves.

A Python task's exception reaches the driver as pyspark's `PythonException`, which carries the worker's traceback
as text. When the task raised one of kcompact's errors on purpose (corrupt input naming the object and the byte, a
store that failed past its retries), the command must still exit with that error's code and print its one-line
message, not exit 1 with a JVM stack trace. The traceback's last line names the error's class and message; the
class is looked up in `compaction.errors` and raised with that message. Any other failure is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.errors import PythonException

from compaction import errors

_RAISED = re.compile(r"^compaction\.errors\.(\w+): (.+)$", re.MULTILINE)


def raised_in_task(exc: PythonException) -> errors.KcompactError | None:
    """The kcompact error whose traceback `exc` carries (the last one named in it), or None."""
    found = _RAISED.findall(str(exc))
    if not found:
        return None
    name, message = found[-1]
    kind = getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.KcompactError)):
        return None
    try:
        raised = kind(message)
    except TypeError:
        raised = None
    if raised is None or str(raised) != message:  # its constructor builds the message from other arguments
        return errors.KcompactError(message)
    return raised


@contextmanager
def kcompact_errors_from_tasks() -> Iterator[None]:
    """Raise a kcompact error that a Spark task raised inside the block as itself (`raised_in_task`)."""
    try:
        yield
    except PythonException as exc:
        raised = raised_in_task(exc)
        if raised is None:
            raise
        raise raised from exc


__all__ = ["kcompact_errors_from_tasks", "raised_in_task"]
