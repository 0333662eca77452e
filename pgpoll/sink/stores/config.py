"""Where an object-store output lives and how to reach it, from the variables each cloud's own tools read.

An output such as ``s3://lake/pg/orders`` (``s3a://`` is the same store),
``gs://bucket/prefix`` or ``az://container/prefix``
(``abfss://container@account.dfs.core.windows.net/prefix`` too) is parsed once
into a :class:`StoreLocation`: the store, the bucket, the key prefix of the
output root, and the settings read from the environment under the names the
AWS, Google and Azure tools use (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
``AWS_ALLOW_HTTP``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_ACCOUNT_NAME``...: :data:`ENV_NAMES`). The same names reach
delta-rs and polars (:meth:`StoreLocation.storage_options`), so one
environment configures every tool that touches the lake.

A location is a value: it pickles (a Spark task gets the driver's settings
with its work, as the batch's DSN already travels with the batch), its
``repr`` shows no secret, and :meth:`StoreLocation.store` builds the obstore
client once per process. Settings the environment does not give (an
instance role, IMDS, a workload identity) are found by the store client in
the process that runs it, as the cloud SDKs do.

Two client settings differ from object_store's defaults on purpose: a
connection must be made within :data:`CONNECT_TIMEOUT`, and the retries
come in two kinds. A run's requests are *patient*: the client retries
each one up to :data:`MAX_RETRIES` times with exponential backoff (throttling
such as S3's ``503 SlowDown``, timeouts and connection resets; object_store
retries only what is safe to repeat), and pgpoll repeats a failed operation
a few more times with a longer backoff, logging each attempt
(:class:`pgpoll.sink.stores.object_store.ObjectStoreOutputFs`). The first requests of a
command (:meth:`StoreLocation.quick`) are not: a wrong secret, a missing
bucket or a stopped endpoint is reported within seconds, not after minutes
of backoff.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlparse

from pgpoll.errors import ConfigError

#: URI schemes pgpoll writes with its own object-store client, and the store each names.
STORE_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az"}

#: The environment variables each store reads (the names its cloud's own tools use; object_store's list).
ENV_NAMES: dict[str, tuple[str, ...]] = {
    "s3": (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_TOKEN", "AWS_REGION",
        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
        "AWS_SKIP_SIGNATURE", "AWS_UNSIGNED_PAYLOAD", "AWS_CHECKSUM_ALGORITHM", "AWS_METADATA_ENDPOINT",
        "AWS_IMDSV1_FALLBACK", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
        "AWS_STS_ENDPOINT", "AWS_SERVER_SIDE_ENCRYPTION", "AWS_SSE_KMS_KEY_ID", "AWS_SSE_BUCKET_KEY_ENABLED",
        "AWS_SSE_CUSTOMER_KEY_BASE64", "AWS_REQUEST_PAYER", "AWS_S3_EXPRESS", "AWS_DISABLE_TAGGING",
    ),
    "gs": (
        "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_BASE_URL", "GOOGLE_BEARER_TOKEN", "GOOGLE_SKIP_SIGNATURE",
    ),
    "az": (
        "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY",
        "AZURE_STORAGE_CLIENT_ID", "AZURE_CLIENT_ID", "AZURE_STORAGE_CLIENT_SECRET", "AZURE_CLIENT_SECRET",
        "AZURE_STORAGE_TENANT_ID", "AZURE_TENANT_ID", "AZURE_STORAGE_AUTHORITY_ID", "AZURE_AUTHORITY_ID",
        "AZURE_STORAGE_AUTHORITY_HOST", "AZURE_AUTHORITY_HOST", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_TOKEN", "AZURE_STORAGE_USE_EMULATOR", "AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT",
        "AZURE_MSI_ENDPOINT", "AZURE_IDENTITY_ENDPOINT", "AZURE_OBJECT_ID", "AZURE_MSI_RESOURCE_ID",
        "AZURE_FEDERATED_TOKEN_FILE", "AZURE_USE_AZURE_CLI", "AZURE_SKIP_SIGNATURE", "AZURE_DISABLE_TAGGING",
        "AZURE_CREDENTIAL_TYPE", "AZURE_ENCRYPTION_KEY",
    ),
}

#: Client settings (not the store's): a plain-http endpoint, and certificates that do not verify.
CLIENT_ENV: dict[str, tuple[tuple[str, str], ...]] = {
    "s3": (("AWS_ALLOW_HTTP", "allow_http"), ("AWS_ALLOW_INVALID_CERTIFICATES", "allow_invalid_certificates")),
    "gs": (("GOOGLE_ALLOW_HTTP", "allow_http"), ("GOOGLE_ALLOW_INVALID_CERTIFICATES", "allow_invalid_certificates")),
    "az": (("AZURE_ALLOW_HTTP", "allow_http"), ("AZURE_ALLOW_INVALID_CERTIFICATES", "allow_invalid_certificates")),
}

#: Where the emulator's blob endpoint is when ``AZURE_STORAGE_USE_EMULATOR`` is set (object_store reads it too).
AZURITE_ENV = "AZURITE_BLOB_STORAGE_URL"
#: Azurite's well-known account and key (published by Microsoft for the emulator; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

_SECRET_WORDS = ("SECRET", "KEY", "TOKEN", "PASSWORD", "SAS", "CREDENTIAL")
CONNECT_TIMEOUT = timedelta(seconds=5)
REQUEST_TIMEOUT = timedelta(seconds=120)
MAX_RETRIES = 3
RETRY_TIMEOUT = timedelta(seconds=30)
QUICK_RETRIES = 2
QUICK_RETRY_TIMEOUT = timedelta(seconds=4)
_STORE_NAMES = {"s3": "S3", "gs": "Google Cloud Storage", "az": "Azure Blob Storage"}
#: The variable to look at first when a store refuses the credentials, per store.
CREDENTIAL_HINT = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance role)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT)",
    "az": "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN, a managed identity)",
}
ENDPOINT_HINT = {"s3": "AWS_ENDPOINT_URL", "gs": "GOOGLE_BASE_URL", "az": "AZURE_STORAGE_ENDPOINT"}


def is_store_url(output: str) -> bool:
    """True when ``output`` names an object store pgpoll writes itself (``s3://``, ``gs://``, ``az://``...)."""
    return urlparse(output).scheme.lower() in STORE_SCHEMES


def is_secret(name: str) -> bool:
    """Whether a setting's value must never be shown (keys, secrets, tokens)."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS) and not upper.endswith(("_FILE", "_PATH", "_ID", "KEY_ENABLED"))


def _env_settings(kind: str, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(store settings, client settings)`` of ``kind`` present (and non-empty) in ``environ``."""
    config = {name: environ[name] for name in ENV_NAMES[kind] if environ.get(name, "").strip()}
    client = {key: environ[name].strip().lower() for name, key in CLIENT_ENV[kind] if environ.get(name, "").strip()}
    if kind == "az" and environ.get(AZURITE_ENV, "").strip():
        config[AZURITE_ENV] = environ[AZURITE_ENV]
    if kind == "s3" and "AWS_ALLOW_HTTP" not in environ:
        endpoint = config.get("AWS_ENDPOINT_URL_S3") or config.get("AWS_ENDPOINT_URL") or config.get("AWS_ENDPOINT") or ""
        if endpoint.startswith("http://"):  # an explicit plain-http endpoint is consent enough (boto3 and DuckDB agree)
            client["allow_http"] = "true"
    return config, client


@dataclass(frozen=True)
class StoreLocation:
    """An output root on an object store, with the settings to reach it (see the module docstring).

    ``kind`` is ``s3``, ``gs`` or ``az``; ``bucket`` the bucket or
    container; ``prefix`` the output's key prefix without slashes at either
    end (``""``: the bucket's root). ``settings`` and ``client`` are the
    store's and the HTTP client's settings as ``(name, value)`` pairs.
    """

    kind: str
    bucket: str
    prefix: str
    settings: tuple[tuple[str, str], ...] = ()
    client: tuple[tuple[str, str], ...] = ()
    account: str | None = None
    patient: bool = True

    @classmethod
    def parse(cls, url: str, environ: Mapping[str, str] | None = None) -> StoreLocation:
        """The location of ``url`` with the settings of ``environ`` (default: this process's environment)."""
        parsed = urlparse(url)
        scheme = parsed.scheme.lower()
        kind = STORE_SCHEMES.get(scheme)
        if kind is None:
            raise ConfigError(f"{url!r} is not an object-store URI", "use s3://bucket/prefix, gs://bucket/prefix or az://container/prefix")
        bucket, account = parsed.netloc, None
        if scheme in ("abfs", "abfss") and "@" in bucket:  # abfss://container@account.dfs.core.windows.net/path
            bucket, host = bucket.split("@", 1)
            account = host.split(".", 1)[0] or None
        if not bucket or any(c in bucket for c in "@:/ "):
            raise ConfigError(f"{url!r} names no bucket", f"write it as {scheme}://BUCKET/prefix")
        config, client = _env_settings(kind, os.environ if environ is None else environ)
        if account and "AZURE_STORAGE_ACCOUNT_NAME" not in config:
            config["AZURE_STORAGE_ACCOUNT_NAME"] = account
        return cls(kind, bucket, parsed.path.strip("/"), tuple(sorted(config.items())), tuple(sorted(client.items())), account)

    def quick(self) -> StoreLocation:
        """The same location with a client that gives up within seconds (start-up checks)."""
        return replace(self, patient=False)

    @property
    def scheme(self) -> str:
        """The scheme pgpoll writes this store's URIs with (``s3``, ``gs``, ``az``)."""
        return self.kind

    @property
    def name(self) -> str:
        """The store's name for messages (``S3``, ``Azure Blob Storage``...)."""
        return _STORE_NAMES[self.kind]

    def url(self, key: str = "") -> str:
        """``<scheme>://<bucket>/<prefix>/<key>``: the canonical URI of a key under the output root."""
        path = "/".join(p for p in (self.prefix, key.strip("/")) if p)
        return f"{self.kind}://{self.bucket}/{path}" if path else f"{self.kind}://{self.bucket}"

    def key(self, url: str) -> str:
        """The key of ``url`` relative to the output root (``url`` made by :meth:`url`)."""
        root = self.url()
        if url == root:
            return ""
        if not url.startswith(root + "/"):
            raise ValueError(f"{url} is not under {root}")
        return url[len(root) + 1:]

    def __repr__(self) -> str:  # never show a secret
        shown = {k: ("***" if is_secret(k) else v) for k, v in self.settings}
        return f"StoreLocation({self.url()!r}, settings={shown})"

    def setting(self, name: str) -> str | None:
        """The value of one setting (None when the environment did not give it)."""
        return dict(self.settings).get(name)

    def endpoint(self) -> str | None:
        """The endpoint the settings name, if any (for messages: an endpoint holds no secret)."""
        names = {"s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"), "gs": ("GOOGLE_BASE_URL",),
                 "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT", AZURITE_ENV)}[self.kind]
        return next((v for n in names if (v := self.setting(n))), None)

    def client_options(self) -> dict[str, Any]:
        """The HTTP client's options: the environment's, plus pgpoll's timeouts."""
        return {**dict(self.client), "connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}

    def store(self) -> Any:
        """The obstore client for the bucket (built once per process and location)."""
        cached = _STORES.get(self._cache_key())
        if cached is not None:
            return cached
        with _STORES_LOCK:
            built = _STORES.get(self._cache_key())
            if built is None:
                built = _STORES[self._cache_key()] = self._build()
            return built

    def _cache_key(self) -> tuple[Any, ...]:
        return (self.kind, self.bucket, self.settings, self.client, self.patient)

    def _build(self) -> Any:
        from obstore.store import AzureStore, GCSStore, S3Store

        settings = self._explicit()
        retry = ({"max_retries": MAX_RETRIES, "retry_timeout": RETRY_TIMEOUT,
                  "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=2), "base": 2}}
                 if self.patient else
                 {"max_retries": QUICK_RETRIES, "retry_timeout": QUICK_RETRY_TIMEOUT,
                  "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=1), "base": 2}})
        common: dict[str, Any] = {"client_options": self.client_options(), "retry_config": retry}
        if self.kind == "s3":
            provider = _profile_credentials(self)
            if provider is not None:
                common["credential_provider"] = provider
            return S3Store(self.bucket, config=cast(Any, settings), **common)
        if self.kind == "gs":
            return GCSStore(self.bucket, config=cast(Any, settings), **common)
        return AzureStore(self.bucket, config=cast(Any, settings), **common)

    def _explicit(self) -> dict[str, str]:
        """The settings with Azurite's emulator spelled out: object_store reads the emulator's address from
        ``AZURITE_BLOB_STORAGE_URL`` in the environment of the process that builds the client, which a Spark
        task's process need not have; the endpoint, account and key travel with the settings instead."""
        settings = {k: v for k, v in self.settings if k != AZURITE_ENV}
        emulator = dict(self.settings).get(AZURITE_ENV) or "http://127.0.0.1:10000"
        if self.kind == "az" and settings.get("AZURE_STORAGE_USE_EMULATOR", "").strip().lower() in ("1", "true", "yes"):
            del settings["AZURE_STORAGE_USE_EMULATOR"]
            account = settings.setdefault("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT)
            if account == AZURITE_ACCOUNT:
                settings.setdefault("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)
            if "AZURE_ENDPOINT" not in settings:
                settings.setdefault("AZURE_STORAGE_ENDPOINT", f"{emulator.rstrip('/')}/{account}")
        return settings

    def storage_options(self) -> dict[str, str]:
        """The settings as ``storage_options`` for delta-rs, polars and the like (the same variable names)."""
        options = self._explicit()
        names = {"s3": "AWS", "gs": "GOOGLE", "az": "AZURE"}[self.kind]
        for key, value in self.client:
            options[f"{names}_{key.upper()}"] = value
            options[key] = value
        if self.kind == "az" and options.get("AZURE_STORAGE_ENDPOINT", "").startswith("http://"):
            options.setdefault("AZURE_ALLOW_HTTP", "true")
            options.setdefault("allow_http", "true")
        return options

    def delta_options(self) -> dict[str, str]:
        """:meth:`storage_options` for pgpoll's own delta-rs calls: its client retries and times out like pgpoll's
        (delta-rs's "Advanced object storage configuration"; polars refuses these keys as strings)."""
        options = self.storage_options()
        options.update({"max_retries": str(MAX_RETRIES), "retry_timeout": f"{int(RETRY_TIMEOUT.total_seconds())}s",
                        "backoff_config.init_backoff": "200ms", "backoff_config.max_backoff": "2s",
                        "connect_timeout": f"{int(CONNECT_TIMEOUT.total_seconds())}s"})
        return options


_STORES: dict[tuple[Any, ...], Any] = {}
_STORES_LOCK = threading.Lock()


def _profile_credentials(location: StoreLocation) -> Any:
    """An AWS profile's credentials through boto3, where ``AWS_PROFILE`` names one and no keys are given.

    object_store reads keys, web identity, container and instance credentials
    itself, but not the shared config files; boto3 does (it is optional:
    without it a profile is an error naming it).
    """
    profile = os.environ.get("AWS_PROFILE", "").strip()
    if not profile or location.setting("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise ConfigError(f"AWS_PROFILE={profile} needs boto3 to read the AWS config files",
                          "pip install boto3, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))
