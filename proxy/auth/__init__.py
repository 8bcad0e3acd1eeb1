"""Identity's I/O: the audit log file, the HTTP port's bearer token check, and the
JWKS fetch for OAUTHBEARER. The decisions are ``kproxy.policies.auth``'s."""
