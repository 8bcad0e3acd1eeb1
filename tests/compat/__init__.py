"""The client compatibility matrix (`make compat`): real clients, direct and through kproxy."""
