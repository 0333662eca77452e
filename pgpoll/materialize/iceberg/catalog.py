"""Which Iceberg catalog ``pgpoll materialize --format iceberg`` writes to, and each table's identifier there.

A catalog is configured the way every pyiceberg user configures one, never
built from pgpoll options: ``--catalog NAME`` loads the catalog ``NAME`` from
``.pyiceberg.yaml`` (in ``PYICEBERG_HOME``, the home directory or the working
directory) or from ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables (``type``,
``uri``, ``warehouse``, ``s3.endpoint``...), exactly as
``pyiceberg.catalog.load_catalog(NAME)`` does. The configuration is read when
the run starts (pyiceberg reads it once, at import), so a variable set by the
calling process after that counts too.

Without ``--catalog`` a local DEST needs nothing: pgpoll opens pyiceberg's
``SqlCatalog`` named ``pgpoll`` on SQLite, ``uri=sqlite:///DEST/_catalog.db``
and ``warehouse=file://DEST`` (tables at ``DEST/<schema>/<table>/``). Any
Iceberg reader opens the same file with the same two settings. A DEST on an
object store has no such default (SQLite cannot live there): that is a
:class:`ConfigError` naming the settings to give.

Identifiers: the PostgreSQL table ``schema.table`` is the table ``table`` in
the one-level namespace ``schema``, both names kept exactly (case, spaces,
dots and all): identifiers are always passed to pyiceberg as tuples, never as
dotted strings, so a ``.`` inside a name is not read as a level separator.
"""

from __future__ import annotations

import os
from typing import Any

from pgpoll.errors import ConfigError, SinkError, first_line
from pgpoll.sink.stores.filesystem import local_path

DEFAULT_NAME = "pgpoll"
"""The name of the default SqlCatalog of a local DEST."""
CATALOG_FILE = "_catalog.db"
"""The SQLite file of the default catalog, in DEST (a name starting with ``_``: no table directory has it)."""
ENV_PREFIX = "PYICEBERG_CATALOG__"


def identifier(schema: str, table: str) -> tuple[str, str]:
    """The catalog identifier of the PostgreSQL table ``schema.table``: namespace ``(schema,)``, table ``table``."""
    return (schema, table)


def default_properties(dest: str) -> dict[str, str] | None:
    """The properties of the default SqlCatalog for ``dest`` (None: ``dest`` is not local)."""
    local = local_path(dest)
    if local is None:
        return None
    root = os.path.abspath(local)
    return {"type": "sql", "uri": f"sqlite:///{root}/{CATALOG_FILE}", "warehouse": f"file://{root}"}


def configured(name: str) -> dict[str, Any] | None:
    """The configuration of catalog ``name`` from ``.pyiceberg.yaml`` and ``PYICEBERG_CATALOG__*`` as they are now."""
    from pyiceberg.utils.config import Config

    found = Config().get_catalog_config(name)
    return dict(found) if found else None


def _settings_hint(name: str) -> str:
    upper = name.upper()
    return (f"configure the catalog in .pyiceberg.yaml (catalog: {name}: uri: ..., warehouse: ...) or with "
            f"{ENV_PREFIX}{upper}__URI and {ENV_PREFIX}{upper}__WAREHOUSE (plus __TYPE, and __S3__ENDPOINT etc. "
            "for an object store), then pass --catalog " + name)


def open_catalog(name: str | None, dest: str) -> Any:
    """The pyiceberg catalog a run writes to (see the module docstring); ConfigError when there is none."""
    if name:
        conf = configured(name)
        if conf is None:
            raise ConfigError(f"no Iceberg catalog named {name!r} is configured", _settings_hint(name))
        return _load(name, conf)
    props = default_properties(dest)
    if props is None:
        raise ConfigError(
            f"--format iceberg on {dest} needs a catalog: the default SQLite catalog works only for a local --to",
            _settings_hint("lake"),
        )
    os.makedirs(props["warehouse"][len("file://"):], exist_ok=True)
    return _load(DEFAULT_NAME, props, default=True)


def _load(name: str, conf: dict[str, Any], *, default: bool = False) -> Any:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.sql import SqlCatalog

    try:  # (the default is opened as itself: a catalog the user named "pgpoll" elsewhere does not mix in)
        return SqlCatalog(name, **{k: v for k, v in conf.items() if k != "type"}) if default else load_catalog(name, **conf)
    except Exception as exc:  # a wrong type, an unreachable REST server, a missing extra...
        raise SinkError(f"cannot open the Iceberg catalog {name!r}: {first_line(exc)}",
                        "check the catalog's settings and that it is reachable") from None


def describe(catalog: Any) -> str:
    """A short description of a catalog for messages: its name and where it lives."""
    props = getattr(catalog, "properties", {}) or {}
    where = props.get("uri") or props.get("warehouse") or "?"
    return f"Iceberg catalog {catalog.name!r} ({where})"
