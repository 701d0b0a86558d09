"""The kernel diff's comparison (tests/golden/kernel_diff.py), on small hand-made corpora:
building real corpora at two commits takes minutes and runs outside CI."""
from __future__ import annotations

from tests.golden.kernel_diff import compare, stage_of


def test_stage_of_names_each_dump_file():
    assert stage_of("cpp/golden.softmax/graph0/kernel_k0.cpp") == "kernel"
    assert stage_of("triton/models.x/graph1/kernel_k12.py") == "kernel"
    assert stage_of("cpp/golden.softmax/graph0/loopir_after_fusion.txt") == "loopir"
    assert stage_of("cpp/golden.softmax/graph0/wrapper.py") == "wrapper"
    assert stage_of("cpp/golden.softmax/graph0/memory_plan.txt") == "memory"
    assert stage_of("cpp/golden.softmax/graph0/aten_graph.py") == "aten"
    assert stage_of("cpp/golden.softmax/error") == "error"


def test_compare_counts_and_prints_each_distinct_change_once():
    old = {"cpp/a/graph0/kernel_k0.cpp": "x = 1;\n", "cpp/a/graph1/kernel_k0.cpp": "x = 1;\n",
           "cpp/a/graph0/kernel_k1.cpp": "same\n", "cpp/a/graph0/wrapper.py": "w1\n",
           "cpp/a/graph0/kernel_k2.cpp": "gone\n"}
    new = {"cpp/a/graph0/kernel_k0.cpp": "x = 2;\n", "cpp/a/graph1/kernel_k0.cpp": "x = 2;\n",
           "cpp/a/graph0/kernel_k1.cpp": "same\n", "cpp/a/graph0/wrapper.py": "w2\n",
           "cpp/a/graph0/kernel_k3.cpp": "new\n", "cpp/b/error": "Traceback\n"}
    printed = []
    counts = compare(old, new, ("kernel",), context=1, write=printed.append)
    assert dict(counts["kernel"]) == {"compared": 3, "changed": 2, "added": 1, "removed": 1, "distinct": 3}
    assert dict(counts["wrapper"]) == {"compared": 1, "changed": 1, "distinct": 1}
    assert counts["error"]["added"] == 1
    text = "\n".join(printed)
    assert text.count("-x = 1;") == 1 and text.count("+x = 2;") == 1  # the two layers' change shown once
    assert "(and 1 more: cpp/a/graph1/kernel_k0.cpp)" in text
    assert "+new" in text and "-gone" in text and "Traceback" in text
    assert "w2" not in text  # the wrapper's stage was not asked for: counted, not printed


def test_compare_of_equal_corpora_prints_nothing():
    corpus = {"cpp/a/graph0/kernel_k0.cpp": "x\n", "cpp/a/graph0/loopir_before_fusion.txt": "y\n"}
    printed = []
    counts = compare(corpus, dict(corpus), ("kernel", "loopir"), context=3, write=printed.append)
    assert printed == []
    assert all(numbers["changed"] + numbers["added"] + numbers["removed"] == 0 for numbers in counts.values())
