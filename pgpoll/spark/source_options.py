"""The options of ``spark.read(Stream).format("pgpoll")``, checked once on the driver.

Pure (no I/O but the environment): Spark hands a data source its options as
strings; :func:`parse_options` turns them into a :class:`SourceOptions` and
refuses what cannot work with a :class:`~pgpoll.errors.ConfigError` naming
the fix, before any connection is opened. Option names are Spark's (matched
without regard to case, as Spark does); the value object uses pgpoll's.

What is read, by the options given:

=========================================  ==============================================================
``slot`` (stream)                          the slot's change log, batch by batch, exactly once
``slot`` (batch read)                      a preview of what the slot holds now (peek: never advances)
a path (``load(PATH)``)                    an output's committed change log (``afterLsn``/``uptoLsn``)
a path and ``table``                       one table's typed changes (``--typed-tables`` outputs)
a path and ``state``                       one table's materialized state (Parquet or Delta)
``slot`` and ``table``                     one table's typed rows of the slot (stream or preview)
=========================================  ==============================================================

The DSN comes from ``dsn``, else ``PGPOLL_DSN``, else libpq's variables
(:func:`pgpoll.source.connection.resolve_dsn`), and never shows in a repr.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.table_patterns import TablePatterns

__all__ = ["KNOWN_OPTIONS", "SourceOptions", "parse_options", "split_table_name"]

KNOWN_OPTIONS = (
    "dsn", "slot", "plugin", "publication", "tables", "excludeTables", "maxRowsPerTrigger", "maxBytesPerTrigger",
    "path", "table", "state", "stateDir", "afterLsn", "uptoLsn",
)
_BY_LOWER = {name.lower(): name for name in KNOWN_OPTIONS}


@dataclass(frozen=True)
class SourceOptions:
    """What to read and how; ``dsn`` is resolved (it may carry a password: never shown)."""

    dsn: str = field(default="", repr=False)
    slot: str | None = None
    plugin: str = "auto"
    publications: tuple[str, ...] = ()
    tables: TablePatterns = field(default_factory=TablePatterns)
    max_rows: int | None = None
    max_bytes: int | None = None
    path: str | None = None
    table: tuple[str, str] | None = None
    state: tuple[str, str] | None = None
    state_dir: str | None = None
    after_lsn: Lsn | None = None
    upto_lsn: Lsn | None = None

    @property
    def reads_slot(self) -> bool:
        """True when the slot is read (a stream, or a preview); False for an output path."""
        return self.path is None


def split_table_name(text: str, option: str) -> tuple[str, str]:
    """``schema.table`` (or ``table``, meaning ``public.table``) as the pair; names as PostgreSQL stores them."""
    from pgpoll.source.names import parse_qualified_name  # the one parser of qualified names (quotes, case)

    try:
        name, end = parse_qualified_name(text.strip())
    except ConfigError as exc:
        raise ConfigError(f"option {option}: {exc.message}", 'write it as schema.table, e.g. public.orders or "My".t') from None
    if end != len(text.strip()):
        raise ConfigError(f"option {option}: {text!r} is not one table name", "write it as schema.table")
    return name.schema, name.table


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None or not str(text).strip():
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"option {name}={text!r} is not a whole number", f"give {name} as a positive integer") from None
    if value <= 0:
        raise ConfigError(f"option {name}={value} must be positive", f"give {name} as a positive integer, or leave it out")
    return value


def _lsn(options: Mapping[str, str], name: str) -> Lsn | None:
    text = options.get(name)
    return Lsn.parse(str(text)) if text else None


def _list(options: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in str(options.get(name) or "").split(",") if p.strip())


def parse_options(raw: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Check Spark's options (``raw``: Spark's case-insensitive dict, or any mapping) for one read.

    ``streaming`` None: not known yet (Spark asks a data source's schema
    before it says whether a batch or a stream reads it).
    """
    options: dict[str, str] = {}
    for key, value in raw.items():
        known = _BY_LOWER.get(key.lower())
        if known is None:
            raise ConfigError(
                f"unknown option {key!r} for format pgpoll",
                "use one of " + ", ".join(KNOWN_OPTIONS) + " (see docs/reference/spark-api.md)",
            )
        options[known] = value
    from pgpoll.source.connection import resolve_dsn  # PGPOLL_DSN and libpq variables are read on the driver

    path = options.get("path")
    slot = options.get("slot")
    if (path is None) == (slot is None):
        raise ConfigError(
            "format pgpoll reads either a slot or an output path" + (", not both" if path else ""),
            'pass .option("slot", NAME) to read changes from PostgreSQL, or .load(PATH) to read a pgpoll output',
        )
    if streaming is True and path is not None:
        raise ConfigError("spark.readStream.format(\"pgpoll\") reads a slot, not an output path",
                          'pass .option("slot", NAME); read an output with spark.read.format("pgpoll").load(PATH)')
    parsed = SourceOptions(
        dsn=resolve_dsn(options.get("dsn")).dsn if slot is not None else "",
        slot=slot,
        plugin=(options.get("plugin") or "auto").strip().lower(),
        publications=_list(options, "publication"),
        tables=TablePatterns(_list(options, "tables"), _list(options, "excludeTables")),
        max_rows=_positive(options, "maxRowsPerTrigger"),
        max_bytes=_positive(options, "maxBytesPerTrigger"),
        path=path,
        table=split_table_name(options["table"], "table") if options.get("table") else None,
        state=split_table_name(options["state"], "state") if options.get("state") else None,
        state_dir=options.get("stateDir") or None,
        after_lsn=_lsn(options, "afterLsn"),
        upto_lsn=_lsn(options, "uptoLsn"),
    )
    _check_combinations(parsed, options, streaming)
    return parsed


def _check_combinations(opts: SourceOptions, given: Mapping[str, str], streaming: bool | None) -> None:
    """Refuse options that do not apply to what is read (a silent no-op would mislead)."""
    def refuse(names: tuple[str, ...], where: str) -> None:
        present = [n for n in names if given.get(n)]
        if present:
            raise ConfigError(f"option {', '.join(present)} does not apply to {where}",
                              "leave it out (docs/reference/spark-api.md says what each option reads)")

    if opts.slot is not None:
        refuse(("state", "stateDir", "afterLsn"), "a slot")
        if streaming is True:
            refuse(("uptoLsn",), "a stream (a batch ends where the query's trigger says)")
        elif streaming is False:
            refuse(("maxRowsPerTrigger", "maxBytesPerTrigger", "uptoLsn"),
                   "a batch read of a slot (a preview reads what is pending)")
        if opts.plugin not in ("auto", "pgoutput", "test_decoding"):
            raise ConfigError(f"option plugin={opts.plugin!r} is not auto, pgoutput or test_decoding",
                              "leave it out: the slot's own plugin is used")
        return
    refuse(("dsn", "plugin", "publication", "maxRowsPerTrigger", "maxBytesPerTrigger"), "an output path")
    if given.get("tables") or given.get("excludeTables"):  # they choose what a slot decodes; an output holds it all
        raise ConfigError("options tables and excludeTables choose what a slot's read decodes, not what is read of "
                          "an output path",
                          'read one table with .option("table", "schema.table"), or filter the change log with '
                          '.where("schema_name = ... AND table_name = ...")')
    if opts.state is not None:
        refuse(("table", "afterLsn", "uptoLsn"), "a materialized state (it has no history)")
    else:
        refuse(("stateDir",), "the change log (it names where option state is read)")
    if opts.after_lsn is not None and opts.upto_lsn is not None and opts.upto_lsn <= opts.after_lsn:
        raise ConfigError(f"uptoLsn {opts.upto_lsn} is not after afterLsn {opts.after_lsn}",
                          "give a range with afterLsn < uptoLsn (changes with afterLsn < commit_lsn <= uptoLsn)")
