"""privacy definitions (autoloaded)."""
