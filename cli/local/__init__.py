"""Set-up for one machine: the embedded Redis server, the local API key, the migrations
that `trainq up` and `trainq serve` run first."""
