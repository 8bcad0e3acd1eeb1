"""A client certificate's principal (mTLS), from the peer certificate ``ssl`` verified.

Kafka names an SSL client by its subject's distinguished name, most specific RDN
first (RFC 2253: ``CN=app,OU=team,O=corp``); ``cn`` takes only the common name. The
certificate was verified against ``tls_client_ca`` in the handshake; this only reads it.
"""

from __future__ import annotations

from typing import Any

SHORT_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
               "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C",
               "domainComponent": "DC", "emailAddress": "EMAILADDRESS", "userId": "UID",
               "streetAddress": "STREET"}
MAX_PRINCIPAL_CHARS = 512


def _escape(value: str) -> str:
    out = "".join(f"\\{c}" if c in ',+"\\<>;=' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


def cert_principal(peercert: dict[str, Any] | None, form: str = "dn") -> str | None:
    """``CN=...,O=...`` (``form="dn"``) or the common name (``"cn"``); None without one."""
    if not peercert:
        return None
    rdns = peercert.get("subject") or ()
    parts: list[str] = []
    common = None
    for rdn in reversed(rdns):
        attrs = []
        for name, value in rdn:
            if name == "commonName" and common is None:
                common = value
            attrs.append(f"{SHORT_NAMES.get(name, name)}={_escape(str(value))}")
        parts.append("+".join(attrs))
    principal = common if form == "cn" else ",".join(parts)
    return principal[:MAX_PRINCIPAL_CHARS] if principal else None
