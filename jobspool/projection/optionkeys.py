"""Storage option names LanceDB (object_store) reads, to catch a misspelt one.

An unknown key is passed through silently by LanceDB: `aws_endpint=...` sent the
projection to AWS itself, where the connect failed on every job. A key close to a known
one (and not known itself) is refused naming the likely one; other unknown keys pass,
so that options of a newer LanceDB are not refused.
"""

from __future__ import annotations

import difflib

_AWS = ("access_key_id", "secret_access_key", "session_token", "region", "default_region",
        "endpoint", "endpoint_url", "bucket", "bucket_name", "virtual_hosted_style_request",
        "s3_express", "imdsv1_fallback", "metadata_endpoint", "unsigned_payload",
        "checksum_algorithm", "container_credentials_relative_uri", "skip_signature",
        "server_side_encryption", "sse_kms_key_id", "sse_bucket_key_enabled",
        "conditional_put", "copy_if_not_exists", "disable_tagging", "request_payer",
        "allow_http", "token", "web_identity_token_file", "role_arn", "role_session_name",
        "sts_endpoint")
_CLIENT = ("allow_http", "allow_invalid_certificates", "timeout", "connect_timeout",
           "pool_idle_timeout", "pool_max_idle_per_host", "http2_keep_alive_interval",
           "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http1_only",
           "http2_only", "proxy_url", "proxy_ca_certificate", "proxy_excludes", "user_agent",
           "default_content_type", "client_max_retries", "client_retry_timeout",
           "randomize_addresses")
_OTHER = ("google_service_account", "google_service_account_key", "google_bucket",
          "google_application_credentials", "service_account", "service_account_key",
          "azure_storage_account_name", "azure_storage_account_key", "azure_client_id",
          "azure_client_secret", "azure_tenant_id", "azure_storage_sas_key",
          "azure_storage_token", "azure_use_emulator", "azure_endpoint", "account_name",
          "account_key", "sas_key", "use_emulator", "download_retry_count",
          "new_table_data_storage_version", "new_table_enable_v2_manifest_paths",
          "jobspool_check_conditional_put")

KNOWN = frozenset((*_AWS, *(f"aws_{k}" for k in _AWS), *_CLIENT, *_OTHER))


def misspelt(key: str) -> str | None:
    """The known option `key` most likely meant, when it is not one itself."""
    k = key.lower()
    if k in KNOWN:
        return None
    close = difflib.get_close_matches(k, KNOWN, n=1, cutoff=0.85)
    return close[0] if close else None


# Names object_store takes for one setting: LanceDB hands it a map of options, so of two
# spellings given different values one wins at random per process (an endpoint given as
# `aws_endpoint` by the app and `endpoint` by a flag: some processes wrote to each).
# (Not `default_region`: object_store takes it only where no region is given, so a region
# and a different default region, as AWS_REGION and AWS_DEFAULT_REGION often are, agree.)
_ALIASES = {"endpoint_url": "endpoint", "session_token": "token", "bucket_name": "bucket"}


def setting_of(key: str) -> str:
    """The setting an option names, whatever its spelling: `AWS_Endpoint_URL` and
    `endpoint` are both "endpoint"."""
    k = key.lower()
    if k.startswith("aws_") and k[4:] in _AWS:
        k = k[4:]
    return _ALIASES.get(k, k)
