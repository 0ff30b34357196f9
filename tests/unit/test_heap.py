"""ragserve.heap.settle: a ready process's startup heap leaves the full collections, and what is
made after it is still collected (docs/benchmarks.md, "Full collections"). Each case runs in a
process of its own: freezing the test process would keep every application the suite drops."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def run(code: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settle_freezes_the_startup_heap_and_later_cycles_are_still_collected() -> None:
    got = run(
        """
        import gc, json
        from ragserve import heap

        startup = [{"n": [i]} for i in range(100_000)]  # what a replica keeps for its life
        garbage = []
        garbage.append(garbage)  # a cycle made at startup and dropped before the process is ready
        del garbage
        before = len(gc.get_objects())
        frozen = heap.settle("test")
        after_settle = len(gc.get_objects())

        freed = [0]
        class Node:
            def __del__(self):
                freed[0] += 1
        for _ in range(1_000):  # cycles made while serving: only the collector frees them
            a, b = Node(), Node()
            a.other, b.other = b, a
        del a, b
        gc.collect()
        left = sum(isinstance(o, Node) for o in gc.get_objects())
        print(json.dumps({"before": before, "frozen": frozen, "after_settle": after_settle,
                          "freed": freed[0], "left": left, "kept": len(startup)}))
        """
    )
    assert got["before"] > 200_000 and got["frozen"] >= 200_000  # the dicts and their lists
    assert got["after_settle"] < 1_000  # a full collection now walks only what is made from here on
    assert got["freed"] == 2_000 and got["left"] == 0  # cycles made after settle are reclaimed
    assert got["kept"] == 100_000


def test_a_full_collection_after_settle_walks_only_the_new_objects() -> None:
    got = run(
        """
        import gc, json
        from ragserve import heap

        startup = [[i] for i in range(300_000)]
        walked = {}
        def count(phase, info):
            if phase == "start" and info["generation"] == 2:
                walked["objects"] = len(gc.get_objects(2)) + len(gc.get_objects(1)) + len(gc.get_objects(0))
        heap.settle("test")
        gc.callbacks.append(count)
        later = [[i] for i in range(5_000)]
        gc.collect()
        print(json.dumps({"walked": walked["objects"], "startup": len(startup), "later": len(later)}))
        """
    )
    assert 5_000 <= got["walked"] < 10_000
