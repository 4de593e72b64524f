"""`remote_log_metadata.HeldHeap`: the broker's metadata process keeps Python's cyclic collector off its followed
state (what survives an answer is frozen), yet a reference cycle among frozen objects is still freed once the frozen
objects have grown enough."""

from __future__ import annotations

import gc
import io
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from compaction.metadata import table_in_store
from compaction.remote_log_metadata import HeldHeap, RemoteTier, serve
from compaction.storage import open_store


class Node:
    """A collector-tracked object that can be part of a cycle and be watched by a weak reference."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen: the rest of the test session collects as usual."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _in_a_generation(obj: object) -> bool:
    """Whether the collector's generations hold `obj`. (Each list is taken before the search iterates it: a list taken
    inside a generator would hold that generator, a cycle that a freeze would keep.)"""
    for generation in range(3):
        objects = gc.get_objects(generation)
        found = any(o is obj for o in objects)
        del objects
        if found:
            return True
    return False


def test_what_survives_an_answer_leaves_the_collectors_generations_and_is_still_freed_by_its_count() -> None:
    heap = HeldHeap(check_every=10**9)
    kept = [Node() for _ in range(3)]
    watched = weakref.ref(kept[0])
    tracked_before = sum(_in_a_generation(n) for n in kept)
    heap.answered()
    tracked_after = sum(_in_a_generation(n) for n in kept)
    assert (tracked_before, tracked_after) == (3, 0), "frozen: a full collection no longer walks them"
    assert gc.get_freeze_count() >= len(kept)
    kept.clear()
    assert watched() is None, "an acyclic object frozen is freed as soon as nothing refers to it"


def test_a_frozen_cycle_is_freed_once_the_frozen_objects_have_grown_past_the_bound() -> None:
    heap = HeldHeap(growth=1.01, check_every=1)
    a, b = Node(), Node()
    a.other, b.other = b, a
    watched = weakref.ref(a)
    heap.answered()  # the cycle is frozen
    del a, b
    gc.collect()
    assert watched() is not None, "a frozen cycle is out of the collector's reach"
    full = heap.full_collections
    grown = [Node() for _ in range(gc.get_freeze_count() // 50 + 10)]  # the frozen objects grow by 2%
    heap.answered()
    assert heap.full_collections == full + 1
    assert watched() is None, "thawed and collected once they grew"
    assert len(grown) > 0


def test_serve_tells_the_heap_of_each_answer(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    heap = HeldHeap(check_every=10**9)
    frozen = gc.get_freeze_count()
    requests = '{"op": "segments", "topic": "orders", "partition": 3, "topic_id": "MWJ6FHTfRYy67jzwZdeqSQ", ' \
               '"broker_id": 7}\n'
    out = io.StringIO()
    serve(RemoteTier.of(table_in_store(store, create=True), store), io.StringIO(requests * 2), out, heap)
    assert len(out.getvalue().splitlines()) == 2
    assert heap.answers == 2
    assert gc.get_freeze_count() > frozen, "the table's state, read by the first answer, frozen after it"
