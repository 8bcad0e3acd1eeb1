"""Virtual clusters: several client-facing clusters on one backend, by name prefix."""
