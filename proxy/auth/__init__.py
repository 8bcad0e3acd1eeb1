"""Identity's I/O: the audit log file, the HTTP port's admin token (followed as its
file is rotated), and the JWKS fetch for OAUTHBEARER. The decisions are
``kproxy.policies.auth``'s."""
