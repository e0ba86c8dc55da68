"""The demos' writers, readers and verifiers: runnable examples, not part of the core layers."""
