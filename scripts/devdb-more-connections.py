"""The dev server with a larger limit of open connections.

SecantusDB refuses connections past 1,000 (its server's `max_connections`), and its
command line has no option for it. This starts the same command line with the limit
given as the first argument. Used by scripts/dev-mongo.sh when
SLOTPOOL_DEV_MAX_CONNECTIONS is set (scripts/bench.sh does: a pool of 200 workers
keeps about 850 connections open).

    python scripts/devdb-more-connections.py 4000 --host 127.0.0.1 --port 27779 ...
"""

import sys

import secantus.cli
import secantus.server

limit = int(sys.argv.pop(1))
start = secantus.server.SecantusDBServer.__init__


def with_limit(self, *args, **kwargs):
    kwargs.setdefault("max_connections", limit)
    start(self, *args, **kwargs)


secantus.server.SecantusDBServer.__init__ = with_limit
sys.argv[0] = "secantusd-py"
sys.exit(secantus.cli.main())
