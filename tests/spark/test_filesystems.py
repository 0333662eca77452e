"""Object-store connector hints and local output checks: pure functions, no JVM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgpoll.errors import SinkError
from pgpoll.spark.filesystems import check_local_output, connector_hint, local_output_problem

# Error texts as Spark 4 / Hadoop 3.4 print them (first line of the Py4J error's Java message).
S3A_CLASS = ("java.lang.RuntimeException: java.lang.ClassNotFoundException: "
             "Class org.apache.hadoop.fs.s3a.S3AFileSystem not found")
S3A_SCHEME = 'org.apache.hadoop.fs.UnsupportedFileSystemException: No FileSystem for scheme "s3a"'
GS_CLASS = ("java.lang.RuntimeException: java.lang.ClassNotFoundException: "
            "Class com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem not found")
ABFS_CLASS = ("java.lang.RuntimeException: java.lang.ClassNotFoundException: "
              "Class org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem not found")


@pytest.mark.parametrize(("error", "uri", "needs"), [
    (S3A_CLASS, "s3a://lake/pg/orders", ["Hadoop's S3 connector (S3A)", "org.apache.hadoop:hadoop-aws:<version>",
                                         "AWS SDK bundle"]),
    (S3A_SCHEME, "s3a://lake/pg/orders", ["Hadoop's S3 connector (S3A)", "hadoop-aws"]),
    (GS_CLASS, "gs://bucket/pg", ["Google's Cloud Storage connector", "gcs-connector-hadoop3-<version>-shaded.jar"]),
    ('No FileSystem for scheme "gs"', "gs://bucket/pg", ["gcs-connector"]),
    (ABFS_CLASS, "abfss://c@acct.dfs.core.windows.net/pg", ["Hadoop's Azure connector (ABFS)",
                                                            "org.apache.hadoop:hadoop-azure:<version>"]),
    ("No FileSystem for scheme: abfs", "abfs://c@acct.dfs.core.windows.net/pg", ["hadoop-azure"]),
])
def test_missing_filesystem_names_the_connector(error: str, uri: str, needs: list[str]) -> None:
    hint = connector_hint(f"py4j.protocol.Py4JJavaError: An error occurred.\n: {error}\n\tat org.apache...", uri)
    assert hint is not None
    assert hint.startswith(f"{uri} needs ")
    assert "on the Spark classpath of the driver and every executor" in hint
    for text in needs:
        assert text in hint


def test_s3_and_unknown_schemes() -> None:
    hint = connector_hint('No FileSystem for scheme "s3"', "s3://lake/x")
    assert hint is not None and hint.startswith("Hadoop has no s3:// filesystem: write s3://lake/x as s3a://")
    other = connector_hint('No FileSystem for scheme "weird"', "weird://x")
    assert other == 'no Hadoop filesystem handles "weird://" (weird://x): add its connector jar to the Spark classpath'


@pytest.mark.parametrize("error", [
    "java.io.FileNotFoundException: File file:/nope does not exist",
    "org.apache.hadoop.fs.s3a.AWSBadRequestException: getFileStatus on s3a://lake/x: 403 Forbidden",
    "S3AFileSystem: ... credentials",  # the class named, but nothing is missing
    "",
])
def test_other_errors_get_no_hint(error: str) -> None:
    assert connector_hint(error, "s3a://lake/x") is None


def test_local_output_fine(tmp_path: Path) -> None:
    assert local_output_problem(str(tmp_path)) is None
    assert local_output_problem(str(tmp_path / "new" / "deeper")) is None
    assert local_output_problem(tmp_path.as_uri() + "/new") is None
    check_local_output(str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()  # checking creates nothing


@pytest.mark.parametrize("uri", ["s3a://lake/x", "hdfs://nn:8020/x", "gs://b/x", "abfss://c@a.dfs.core.windows.net/x"])
def test_other_schemes_are_not_checked(uri: str) -> None:
    assert local_output_problem(uri) is None


def test_output_below_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    output = str(tmp_path / "file" / "out")
    assert local_output_problem(output) == (
        f"cannot create output {output}: {tmp_path / 'file'} is a regular file, not a directory",
        "choose an --output whose parent directories are directories",
    )
    with pytest.raises(SinkError) as raised:
        check_local_output(tmp_path.as_uri() + "/file/out/deeper")  # checkout-paths: data
    assert "is a regular file, not a directory" in raised.value.message


def test_output_that_is_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    problem = local_output_problem(str(tmp_path / "file"))
    assert problem is not None and problem[0].endswith("is a regular file, not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_output_in_a_directory_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        problem = local_output_problem(str(locked / "out"))
        assert problem is not None and problem[0].endswith(f"{locked} is not writable by this user")
        problem = local_output_problem(str(locked))
        assert problem is not None and problem[0].endswith("is not writable by this user")
    finally:
        locked.chmod(0o755)


def test_output_in_a_directory_not_writable_as_seen_by_access(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, also as root: os.access is what decides."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    problem = local_output_problem(str(locked / "a" / "b"))
    assert problem == (f"cannot create output {locked / 'a' / 'b'}: {locked} is not writable by this user",
                       f"create {locked / 'a' / 'b'} as a user who may, and give the user running pgpoll write "
                       "permission on it, or choose another --output")
    with pytest.raises(SinkError):
        check_local_output(str(locked))
