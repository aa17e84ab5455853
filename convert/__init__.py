"""convert package (to come)."""
