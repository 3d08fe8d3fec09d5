"""The work behind the routes, one module per resource. See docs/api.md."""
