"""Signed webhooks: endpoints a key registers for event types (`endpoints`), the outbox of
events written in the transaction of each change (`outbox`), where a webhook may go
(`addresses`), how it is signed (`signing`), sent (`sender`), retried and logged
(`deliveries`), and the dispatcher that delivers them (`dispatcher`). Import each module
itself: this package imports nothing, so that the store's import of the outbox stays light.
See docs/api.md ("Webhooks")."""
