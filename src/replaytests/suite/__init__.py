"""The pytest layer: the plugin's hooks and the session they share."""
