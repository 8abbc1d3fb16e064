"""vindex.freeze_heap: start-up objects leave the collector's passes, later garbage does not."""
import gc

import vindex


class Node:
    def __init__(self) -> None:
        self.other = None


def test_freeze_heap_takes_live_objects_out_of_collection_and_still_collects_new_cycles():
    before = Node()
    try:
        frozen = vindex.freeze_heap()
        assert frozen == gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # the permanent generation is not walked
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2  # a cycle made after the freeze is garbage as usual
    finally:
        gc.unfreeze()
    assert any(o is before for o in gc.get_objects())
