"""kiln/debug: KILN_DEBUG dumps and stage timings; observes every stage, nothing depends on it."""
from kiln.debug.dump import GraphDump

__all__ = ["GraphDump"]
