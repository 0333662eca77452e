"""OpenLineage names for what pgpoll reads and writes, and the parent run it was started by (pure).

A lineage graph joins the events of different tools by dataset ``(namespace, name)``, so pgpoll names its
datasets as OpenLineage's naming spec (``spec/Naming.md``) and ``openlineage.client.naming`` do:

* a PostgreSQL table: namespace ``postgres://{host}:{port}``, name ``{database}.{schema}.{table}``. The
  host and port are the DSN's (libpq's ``PGHOST``/``PGPORT``/``PGDATABASE`` where it names none), as
  Airflow's SQL operators name the same server from their connection. A multi-host DSN
  (``host=a,b port=5432,5433``, the failover list) is named by its *first* host and port: every run of the
  same DSN names the same server, whichever host answered. A pooler (PgBouncer) in front of the server is
  what the DSN names, so its address would be the namespace; ``PGPOLL_LINEAGE_NAMESPACE`` names the server
  instead (``postgres://db1.internal:5432``), as the other tools that read it directly name it. A Unix
  socket directory is named ``localhost``.
* a path: namespace ``file`` and the absolute path for a local output; ``s3://{bucket}`` (``s3a:`` and
  ``s3n:`` too), ``gs://{bucket}``, ``abfss://{container}@{account}.dfs.core.windows.net`` (``az://`` and
  ``azure://`` outputs, with the account from ``AZURE_STORAGE_ACCOUNT_NAME``), ``hdfs://{host}:{port}``,
  and the key or path under it without a leading slash for object stores.
* the parent run: ``OPENLINEAGE_PARENT_ID`` and ``OPENLINEAGE_ROOT_PARENT_ID``
  (``{namespace}/{job name}/{run id}``, what Airflow's OpenLineage provider's ``lineage_parent_id`` macro
  renders and dbt-ol reads), else the Spark properties the provider injects into ``spark-submit``
  (``spark.openlineage.parentJobNamespace``, ``parentJobName``, ``parentRunId`` and the ``rootParent*``
  ones).

No user name, password or query parameter of a DSN or URL ever reaches a name.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

NAMESPACE_ENV = "PGPOLL_LINEAGE_NAMESPACE"
PARENT_ENV = "OPENLINEAGE_PARENT_ID"
ROOT_PARENT_ENV = "OPENLINEAGE_ROOT_PARENT_ID"
SPARK_PARENT = ("spark.openlineage.parentJobNamespace", "spark.openlineage.parentJobName", "spark.openlineage.parentRunId")
SPARK_ROOT = (
    "spark.openlineage.rootParentJobNamespace", "spark.openlineage.rootParentJobName", "spark.openlineage.rootParentRunId",
)
DEFAULT_PORT = "5432"
_KV = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")


def dsn_params(dsn: str) -> dict[str, str]:
    """The keywords of a libpq connection string, URI or ``key=value`` form (only those naming the server).

    Parsed here rather than by libpq: the names need nothing of a driver, and nothing but host, port and
    database is kept, so no secret can leak through them.
    """
    dsn = dsn.strip()
    out: dict[str, str] = {}
    if re.match(r"^postgres(ql)?(\+\w+)?://", dsn, re.IGNORECASE):
        rest = dsn.split("://", 1)[1]
        netloc, _, tail = rest.partition("/")
        netloc = netloc.rpartition("@")[2]  # drop user:password@
        path, _, query = tail.partition("?")
        hosts, ports = [], []
        for part in netloc.split(","):
            host, port = part, ""
            if part.startswith("["):  # [::1]:5432
                host, _, after = part[1:].partition("]")
                port = after.lstrip(":")
            elif ":" in part:
                host, _, port = part.rpartition(":")
            hosts.append(unquote(host))
            ports.append(port)
        if any(hosts):
            out["host"] = ",".join(hosts)
        if any(ports):
            out["port"] = ",".join(ports)
        if path:
            out["dbname"] = unquote(path)
        for item in query.split("&"):
            key, _, value = item.partition("=")
            if key in ("host", "hostaddr", "port", "dbname"):
                out[key] = unquote(value)
        return out
    for match in _KV.finditer(dsn):
        key, value = match.group(1), match.group(2)
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        if key in ("host", "hostaddr", "port", "dbname"):
            out[key] = value
    return out


@dataclass(frozen=True)
class ServerName:
    """Where the captured tables live, as OpenLineage names it: the namespace and the database."""

    namespace: str
    database: str

    def table(self, schema: str, table: str) -> str:
        """A table's dataset name: ``{database}.{schema}.{table}``."""
        return f"{self.database}.{schema}.{table}"


def server_name(dsn: str, env: Mapping[str, str] | None = None) -> ServerName:
    """The source's namespace and database (see the module docstring), from the DSN and libpq's variables."""
    env = os.environ if env is None else env
    params = dsn_params(dsn) if dsn else {}
    database = params.get("dbname") or env.get("PGDATABASE") or env.get("PGUSER") or "postgres"
    override = env.get(NAMESPACE_ENV, "").strip()
    if override:
        return ServerName(override.rstrip("/"), database)
    host = (params.get("host") or params.get("hostaddr") or env.get("PGHOST") or "localhost").split(",")[0].strip()
    port = (params.get("port") or env.get("PGPORT") or DEFAULT_PORT).split(",")[0].strip() or DEFAULT_PORT
    if not host or host.startswith("/") or host.startswith("@"):  # a Unix socket directory (or abstract socket)
        host = "localhost"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return ServerName(f"postgres://{host.lower()}:{port}", database)


def location(uri: str, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The ``(namespace, name)`` of a path or URL pgpoll writes (see the module docstring)."""
    env = os.environ if env is None else env
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):  # a path (or C:\ on Windows)
        path = parts.path if scheme == "file" else uri
        return "file", os.path.abspath(path).rstrip("/") or "/"
    host = (parts.hostname or "").lower()
    key = parts.path.strip("/")
    if scheme in ("s3", "s3a", "s3n"):
        return f"s3://{host}", key
    if scheme in ("gs", "gcs"):
        return f"gs://{host}", key
    if scheme in ("abfs", "abfss"):
        container, _, account_host = parts.netloc.partition("@")
        return f"abfss://{container}@{account_host.lower()}", key
    if scheme in ("az", "azure", "adl"):
        account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT") or "unknown"
        return f"abfss://{host}@{account}.dfs.core.windows.net", key
    authority = f"{host}:{parts.port}" if parts.port else host
    return f"{scheme}://{authority}", key


def join(base: tuple[str, str], *parts: str) -> tuple[str, str]:
    """``base`` with path parts appended to its name."""
    namespace, name = base
    tail = "/".join(p.strip("/") for p in parts if p)
    return namespace, (f"{name.rstrip('/')}/{tail}" if name else tail)


@dataclass(frozen=True)
class RunRef:
    """A job run another system told pgpoll about: its job's namespace and name and its run id."""

    namespace: str
    name: str
    run_id: str


@dataclass(frozen=True)
class Parent:
    """The run that started this one (``parent``) and the top of its tree (``root``), for the parent facet."""

    parent: RunRef
    root: RunRef | None = None


def parse_run_ref(text: str) -> RunRef | None:
    """``{namespace}/{job name}/{run id}`` (the run id a UUID; a job name may hold slashes) or None."""
    namespace, _, rest = text.strip().partition("/")
    name, _, run_id = rest.rpartition("/")
    if not namespace or not name or not _is_uuid(run_id):
        return None
    return RunRef(namespace, name, run_id)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _from_keys(conf: Mapping[str, str], keys: tuple[str, str, str]) -> RunRef | None:
    namespace, name, run_id = (str(conf.get(k) or "").strip() for k in keys)
    return RunRef(namespace, name, run_id) if namespace and name and _is_uuid(run_id) else None


def parent_run(env: Mapping[str, str], spark_conf: Mapping[str, str] | None = None) -> Parent | None:
    """The parent run from the environment, else from the Spark properties (see the module docstring)."""
    parent = parse_run_ref(env.get(PARENT_ENV, ""))
    if parent is not None:
        root = parse_run_ref(env.get(ROOT_PARENT_ENV, ""))
        return Parent(parent, root)
    if spark_conf:
        parent = _from_keys(spark_conf, SPARK_PARENT)
        if parent is not None:
            return Parent(parent, _from_keys(spark_conf, SPARK_ROOT))
    return None
