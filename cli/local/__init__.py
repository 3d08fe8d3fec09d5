"""Set-up for one machine: the embedded Redis server, the local API key, and the lock that
one `trainq up` holds on a data folder. See docs/operations.md ("Running the service")."""
