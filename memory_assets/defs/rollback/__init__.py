"""rollback definitions (autoloaded)."""
