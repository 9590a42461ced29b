"""Running compiled operations: argument checks, the thread pool, the Operation object."""
