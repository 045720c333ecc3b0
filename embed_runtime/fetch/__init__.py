"""Request-path image fetching: one guarded URL fetch and the pool that runs many."""
