"""Moved to :mod:`pgpoll.materialize.delta.names` (0.2: the Delta state became a sub-package).

This import path keeps working for code written against 0.1: it is the same module object, so every name,
private ones included, and every patch of one, reach the new module.
"""

import sys

from pgpoll.materialize.delta import names as _moved

sys.modules[__name__] = _moved
