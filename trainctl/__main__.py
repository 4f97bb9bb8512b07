"""`python -m trainctl ...`"""

from __future__ import annotations

from trainctl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
