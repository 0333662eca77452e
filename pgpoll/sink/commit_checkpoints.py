"""Moved to :mod:`pgpoll.sink.commit.checkpoints` (0.2: the sink's stores and commit log became sub-packages).

This import path keeps working for code written against 0.1: it is the same module object, so every name,
private ones included, and every patch of one, reach the new module.
"""

import sys

from pgpoll.sink.commit import checkpoints as _moved

sys.modules[__name__] = _moved
