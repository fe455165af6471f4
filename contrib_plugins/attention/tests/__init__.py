"""The attention plugin's tests (a package, so its conftest does not shadow the main suite's)."""
