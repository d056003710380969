"""lazyx's built-in op packs. Each module is a plugin registered through lazyx's own
entry points (``[project.entry-points.lazyx]`` in pyproject.toml), exactly as a
third-party pack would be."""
