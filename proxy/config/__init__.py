"""Configuration: every option declared once (``options``) and the settings in force
(``settings``: read from a file, the environment and flags).
"""
