"""Filters: sans-IO classes, built in or the user's, chained per connection (see ``api``)."""
