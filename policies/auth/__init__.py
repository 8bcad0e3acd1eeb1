"""Identity at the proxy, without I/O: the users file, the SASL mechanisms the proxy
terminates, the handlers that answer SaslHandshake and SaslAuthenticate, and the
records an audit log is made of. The shell (``kproxy.runtime``, ``kproxy.auth``) reads
files, keeps time and writes the audit log."""
