"""lastword's platform-free core: ingest, timers, cycles, the store and the model."""
