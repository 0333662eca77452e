"""The SparkSession factory: which settings it adds, and a real start that prints no Spark noise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgpoll.spark import session as spark_session_module
from pgpoll.spark.session import builder_settings, debug_requested, log4j2_config_path, quiet_java_options, under_spark_submit


def test_log4j2_file_is_shipped_and_quiet() -> None:
    text = log4j2_config_path().read_text()
    assert "rootLogger.level = error" in text
    assert "org.apache.hadoop.util.NativeCodeLoader" in text
    # without a level for the gateway's logger Spark prints 'Setting default log level to "WARN"'
    assert "org.apache.spark.api.python.PythonGatewayServer" in text


def test_pyproject_ships_the_log4j2_file_as_package_data() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"spark/log4j2.properties"' in pyproject


@pytest.mark.parametrize(("value", "expected"), [
    (None, False), ("", False), ("0", False), ("no", False), ("1", True), ("true", True), ("YES", True),
])
def test_debug_requested_by_environment(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool) -> None:
    if value is None:
        monkeypatch.delenv("PGPOLL_DEBUG", raising=False)
    else:
        monkeypatch.setenv("PGPOLL_DEBUG", value)
    assert debug_requested() is expected
    assert debug_requested(verbose=True) is True


def test_under_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_ENV_LOADED", raising=False)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    assert not under_spark_submit()
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.master=local[1] pyspark-shell")
    assert under_spark_submit()
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    monkeypatch.setenv("SPARK_ENV_LOADED", "1")
    assert under_spark_submit()


def test_quiet_java_options_is_one_option_even_with_spaces(tmp_path: Path) -> None:
    config = tmp_path / "a dir" / "log4j2.properties"
    config.parent.mkdir()
    config.write_text("")
    option = quiet_java_options(config)
    assert option.startswith("-Dlog4j2.configurationFile=file:/")
    assert " " not in option
    assert quiet_java_options().endswith("/pgpoll/spark/log4j2.properties")  # checkout-paths: data


def test_builder_settings_new_jvm_quiet() -> None:
    settings = builder_settings(show_spark_logs=False, submitted=False, jvm_running=False)
    assert settings == {
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": quiet_java_options(),
    }


def test_builder_settings_verbose_or_running_jvm_keep_spark_logging() -> None:
    assert builder_settings(show_spark_logs=True, submitted=False, jvm_running=False) == {
        "spark.ui.showConsoleProgress": "false"}
    assert builder_settings(show_spark_logs=False, submitted=False, jvm_running=True) == {
        "spark.ui.showConsoleProgress": "false"}


def test_builder_settings_under_spark_submit_add_nothing() -> None:
    assert builder_settings(show_spark_logs=False, submitted=True, jvm_running=False) == {}


def test_builder_settings_without_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # e.g. pgpoll imported from a zip (spark-submit --py-files): no file to point the JVM at
    monkeypatch.setattr(spark_session_module, "log4j2_config_path", lambda: tmp_path / "missing.properties")
    assert builder_settings(show_spark_logs=False, submitted=False, jvm_running=False) == {
        "spark.ui.showConsoleProgress": "false"}


_START = """
from pgpoll.spark.session import spark_session
session = spark_session("pgpoll-test-quiet")
assert session.sparkContext.appName == "pgpoll-test-quiet"
assert session.conf.get("spark.ui.showConsoleProgress") == "false"
print("rows", session.range(3).count())
session.stop()
"""


def test_a_real_start_prints_no_spark_noise() -> None:
    """A fresh driver JVM started by pgpoll: nothing from Spark's logging reaches stderr."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PGPOLL_DEBUG", "SPARK_ENV_LOADED", "PYSPARK_SUBMIT_ARGS")}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    done = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rows 3"
    noise = [line for line in done.stderr.splitlines()
             # the JVM itself prints this before any logging exists; nothing can hide it from Python
             if line.strip() and "Using incubator modules" not in line]
    assert noise == []


def test_local_master_expected(monkeypatch: Any, tmp_path: Any) -> None:
    """Spark's master as far as it is known before Spark starts: local unless spark-submit or a config says otherwise."""
    from pgpoll.spark.session import local_master_expected

    for name in ("SPARK_ENV_LOADED", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert local_master_expected() is True
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    (tmp_path / "spark-defaults.conf").write_text("spark.master   local[4]\n")
    assert local_master_expected() is True
    (tmp_path / "spark-defaults.conf").write_text("# cluster\nspark.master   spark://head:7077\n")
    assert local_master_expected() is False
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--master yarn pyspark-shell")
    assert local_master_expected() is False
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    monkeypatch.setenv("SPARK_ENV_LOADED", "1")  # under spark-submit: the master is not known here
    assert local_master_expected() is False
