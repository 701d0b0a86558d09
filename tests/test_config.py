"""kiln/config.py: the one registry of options; an option's value is checked where it is set."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import kiln
from kiln.config import LOG_TOPICS

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_unknown_log_topic_raises_listing_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown log topic\(s\) 'graph_break'; valid topics: graph_breaks, "
                                         r"recompiles, guards, kernels, perf"):
        kiln.config.logs = "guards,graph_break"
    with pytest.raises(ValueError, match="valid topics"):
        with kiln.config.patch(logs="kernel"):
            pass
    assert kiln.config.logs == ""  # unchanged by the refused values
    with kiln.config.patch(logs=" guards, perf,"):
        assert kiln.config.logs == "guards,perf" and kiln.config.log_enabled("perf")
    assert set(LOG_TOPICS) >= {"graph_breaks", "recompiles", "guards", "kernels", "perf"}


def test_unknown_kiln_logs_topic_in_the_environment_raises_at_import(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_LOGS": "recompiles,graph-breaks"}
    result = subprocess.run([sys.executable, "-c", "import kiln"], cwd=tmp_path, env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "KILN_LOGS" in result.stderr and "'graph-breaks'" in result.stderr and "graph_breaks" in result.stderr


def test_checked_options_name_the_valid_ones():
    assert kiln.config.checked({"strict": True, "logs": "guards"}) == {"strict": True, "logs": "guards"}
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'stritc'; valid options: .*strict"):
        kiln.config.checked({"stritc": True})
    with pytest.raises(TypeError, match="strict takes a bool"):
        kiln.config.checked({"strict": 1})
    assert kiln.config.checked({"verify_ir": None, "progress_after_s": 2}) == {"verify_ir": None,
                                                                              "progress_after_s": 2}


def test_an_unknown_partitioner_raises_listing_the_choices():
    # checked when set, not at a training graph's compile (where it would become a silent eager fallback)
    with pytest.raises(ValueError, match=r"partitioner.*'default', 'min_cut'"):
        kiln.config.partitioner = "mincut"
    with pytest.raises(ValueError, match="min_cut"):
        kiln.compile(lambda x: x + 1, options={"partitioner": "greedy"})
    with kiln.config.patch(partitioner="default"):
        assert kiln.config.partitioner == "default"
    assert kiln.config.partitioner == "min_cut"
