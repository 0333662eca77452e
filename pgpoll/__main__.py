"""``python -m pgpoll``: the same as the ``pgpoll`` command."""

from __future__ import annotations

from pgpoll.cli.main import main

if __name__ == "__main__":
    main()
