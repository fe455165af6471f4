"""The engine: memory planning, the plan file container, and (next) builder and runtime."""
