"""kiln/debug: KILN_DEBUG dumps and stage timings; observes every stage, nothing depends on it.

Importing it registers GraphDump as the backend's stage recorder (`kiln.backend.set_stage_recorder`):
the pipeline reports each stage to it without importing kiln.debug.
"""
from kiln import backend
from kiln.debug.dump import GraphDump

backend.set_stage_recorder(GraphDump.new)

__all__ = ["GraphDump"]
