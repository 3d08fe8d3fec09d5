"""The work behind the routes, one module per resource."""
