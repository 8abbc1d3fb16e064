"""TLS for the server: credentials from PEM files, checked before the server binds."""
from __future__ import annotations

import ssl
from typing import Any

import grpc


def _read_pem(path: str, what: str, marker: str) -> bytes:
    with open(path, "rb") as f:
        pem = f.read()
    if b"-----BEGIN " not in pem or marker.encode() not in pem:
        raise ValueError(f"{what}: expected a PEM file holding a {marker.lower()}, got {path}")
    return pem


def server_credentials(config: Any) -> grpc.ServerCredentials | None:
    """TLS credentials from the PEM files a ``ServerConfig`` names (``tls_cert``, ``tls_key``,
    optional ``tls_client_ca`` for mutual TLS), or None to serve plaintext."""
    if config.tls_cert is None and config.tls_key is None:
        if config.tls_client_ca is not None:
            raise ValueError("tls_client_ca: needs tls_cert and tls_key (mutual TLS is TLS first)")
        return None
    if config.tls_cert is None or config.tls_key is None:
        raise ValueError("tls_cert and tls_key: expected both (a certificate and its private key), got one")
    cert = _read_pem(config.tls_cert, "tls_cert", "CERTIFICATE")
    key = _read_pem(config.tls_key, "tls_key", "PRIVATE KEY")

    def no_password() -> bytes:
        raise ValueError(f"tls_key: {config.tls_key} is encrypted; expected an unencrypted private key")

    try:  # gRPC would only say "failed to bind" about a key that does not match its certificate
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(config.tls_cert, config.tls_key, password=no_password)
    except ssl.SSLError as e:
        raise ValueError(f"tls_cert and tls_key: {config.tls_cert} and {config.tls_key} are not a certificate "
                         f"and its private key ({e.reason or e})") from None
    ca = None if config.tls_client_ca is None else _read_pem(config.tls_client_ca, "tls_client_ca", "CERTIFICATE")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
