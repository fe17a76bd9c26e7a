"""Job model, on-disk store, locking, state machine, `Spool` and `Worker`."""
