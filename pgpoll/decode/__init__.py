"""Pure decoders: plugin output in, pgpoll's change model (``pgpoll.changes``) out. No I/O."""
