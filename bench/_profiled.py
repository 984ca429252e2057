"""``python bench/_profiled.py STATS ARGS...``: ``blis ARGS...`` under cProfile, the stats
written to STATS however the command ends (``serve_bench.py --profile``)."""

import cProfile
import sys

from blis_fast.cli import main

if __name__ == "__main__":
    stats = sys.argv.pop(1)
    prof = cProfile.Profile()
    try:
        prof.runcall(main, sys.argv[1:])
    except SystemExit:
        pass
    finally:
        prof.dump_stats(stats)
