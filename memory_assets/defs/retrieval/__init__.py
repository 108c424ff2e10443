"""retrieval definitions (autoloaded): the nightly re-promotion sweep."""
