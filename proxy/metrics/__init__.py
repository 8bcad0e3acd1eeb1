"""What the proxy counts about itself and writes on /metrics.

Its own families, the per-API figures, consumer groups, the sliced exposition and the
merge of several workers' expositions.
"""
