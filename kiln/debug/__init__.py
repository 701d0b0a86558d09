"""kiln/debug: KILN_DEBUG dumps and stage timings; observes every stage, nothing depends on it.

Importing it registers GraphDump as the backend's stage recorder (`kiln.backend.set_stage_recorder`):
the pipeline reports each stage to it without importing kiln.debug. With KILN_REPORT set, it also
starts the HTML compile report's recording (kiln/debug/html_report.py); unset, that module is not
even imported.
"""
from kiln import backend
from kiln.config import config
from kiln.debug.dump import GraphDump

backend.set_stage_recorder(GraphDump.new, GraphDump.keeps_stages)

if config.report:
    from kiln.debug import html_report

    html_report.enable()

__all__ = ["GraphDump"]
