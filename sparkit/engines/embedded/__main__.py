"""`python -m sparkit.engines.embedded --model-path DIR ...`: serve a tiny-ling checkpoint (see server.py)."""

import sys

from sparkit.engines.embedded.server import main

if __name__ == "__main__":
    sys.exit(main())
