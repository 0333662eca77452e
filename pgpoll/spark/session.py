"""The one place pgpoll builds its SparkSession, quietly unless asked otherwise.

Every Spark start-up prints warnings an operator cannot act on (native-hadoop
library, Spark's default log4j profile, the hostname resolving to a loopback
address, "Setting default log level"); under ``spark-submit`` a short run prints
a hundred INFO lines. pgpoll's own log lines and its JSON summary come from
Python and are what an operator reads, so Spark's are hidden by default:

- when pgpoll starts the driver JVM itself (``pgpoll ingest``, ``pgpoll
  materialize``), the JVM gets the ``log4j2.properties`` shipped in this package
  (only errors) through ``spark.driver.extraJavaOptions``; options given in
  ``PYSPARK_SUBMIT_ARGS`` come later on the launcher's command line and win;
- when the JVM already runs (``spark-submit``, a session created earlier), its
  configuration can no longer change, so the log level is lowered to ERROR once
  the context exists. For ``spark-submit`` itself the same file is shipped by
  ``make dist`` and passed with ``--driver-java-options``.

``verbose=True`` or ``PGPOLL_DEBUG=1`` leaves Spark's logging as Spark sets it.
One line cannot be hidden from here: the JVM's own "Using incubator modules"
warning, printed before any logging exists.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J2_FILE = "log4j2.properties"
"""The name of the quiet Log4j 2 configuration, in this package and in ``make dist``'s output."""

DEBUG_ENV = "PGPOLL_DEBUG"
VERBOSE_ENV = "PGPOLL_VERBOSE"  # set by every command's --verbose


def log4j2_config_path() -> Path:
    """The quiet Log4j 2 configuration shipped with pgpoll (package data)."""
    return Path(__file__).with_name(LOG4J2_FILE)


def debug_requested(verbose: bool = False) -> bool:
    """True when Spark's own logging should be shown: ``verbose`` or ``PGPOLL_DEBUG`` set to a true value."""
    return verbose or any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"} for name in (DEBUG_ENV, VERBOSE_ENV)
    )


def under_spark_submit() -> bool:
    """True when the driver JVM was started by ``spark-submit`` (or the launcher was given a master)."""
    return bool(os.environ.get("SPARK_ENV_LOADED")) or "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")


def local_master_expected(spark: Any = None) -> bool:
    """True when this run's Spark is (or would be) local mode: its executors are this machine.

    With a session given, its master says. Otherwise Spark has not started:
    under ``spark-submit`` the master is not known here (False); without it,
    PySpark starts ``local[*]`` unless ``PYSPARK_SUBMIT_ARGS`` or
    ``spark-defaults.conf`` (in ``SPARK_CONF_DIR`` or ``SPARK_HOME/conf``)
    names another master.
    """
    if spark is not None:
        return str(spark.sparkContext.master).startswith("local")
    if under_spark_submit() or "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return False
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        str(Path(os.environ["SPARK_HOME"]) / "conf") if os.environ.get("SPARK_HOME") else None)
    defaults = Path(conf_dir) / "spark-defaults.conf" if conf_dir else None
    if defaults is not None and defaults.is_file():
        for line in defaults.read_text(errors="replace").splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0] == "spark.master" and not parts[1].strip().startswith("local"):
                return False
    return True


def quiet_java_options(config: Path | None = None) -> str:
    """The driver JVM option that points Log4j 2 at the quiet configuration.

    A ``file:`` URI, so that a path with spaces stays one option when Spark splits
    the option string on whitespace.
    """
    path = (config or log4j2_config_path()).resolve()
    return f"-Dlog4j2.configurationFile={path.as_uri()}"


def builder_settings(*, show_spark_logs: bool, submitted: bool, jvm_running: bool) -> dict[str, str]:
    """The Spark settings :func:`spark_session` adds for one start (pure, for tests).

    Nothing under ``spark-submit`` (its own options rule there); otherwise no
    console progress bar, and the quiet Log4j 2 file when a new driver JVM is
    about to start and Spark's logs are not wanted.
    """
    settings: dict[str, str] = {}
    if submitted:
        return settings
    settings["spark.ui.showConsoleProgress"] = "false"
    if not show_spark_logs and not jvm_running and log4j2_config_path().is_file():
        settings["spark.driver.extraJavaOptions"] = quiet_java_options()
    return settings


def spark_session(app_name: str, verbose: bool = False) -> SparkSession:
    """The SparkSession for a pgpoll job (``"pgpoll-ingest"``, ``"pgpoll-materialize"``).

    Executors use this Python unless ``PYSPARK_PYTHON`` says otherwise; the
    console progress bar is off when pgpoll starts Spark itself (it would
    interleave with pgpoll's own progress line). Spark's start-up noise is hidden
    unless ``verbose`` or ``PGPOLL_DEBUG=1`` (see the module docstring).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    show_spark_logs = debug_requested(verbose)
    jvm_running = SparkContext._active_spark_context is not None  # no public accessor
    builder = SparkSession.builder.appName(app_name)
    settings = builder_settings(show_spark_logs=show_spark_logs, submitted=under_spark_submit(), jvm_running=jvm_running)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not show_spark_logs:
        session.sparkContext.setLogLevel("ERROR")
    configure_writes(session)
    return session


#: SQL settings every pgpoll job applies to the session it runs in (its own or one it was given).
WRITE_SETTINGS = {
    # Spark's default, INT96, reads back as a naive timestamp in pyarrow and DuckDB (a timestamptz of
    # 12:00:50+02 reads as 10:00:50 with no zone); TIMESTAMP(MICROS) adjusted to UTC reads as
    # timestamp[us, tz=UTC], and timestamp without time zone stays not adjusted.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


def configure_writes(session: SparkSession) -> None:
    """Apply :data:`WRITE_SETTINGS` (runtime SQL settings: they work under spark-submit too)."""
    for key, value in WRITE_SETTINGS.items():
        session.conf.set(key, value)
