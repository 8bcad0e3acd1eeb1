"""The HTTP port: a small h11 server, its routes, the status page, and an h11 client.

The routes read the running proxy through ``kproxy.runtime.server.Proxy`` alone.
"""
