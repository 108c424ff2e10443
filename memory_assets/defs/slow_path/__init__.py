"""slow_path definitions (autoloaded)."""
