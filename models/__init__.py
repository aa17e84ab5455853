"""models package (to come)."""
