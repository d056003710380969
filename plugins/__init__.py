"""lazyx's built-in op packs. Each module is a plugin registered through lazyx's own
entry points (``[project.entry-points.lazyx]`` in pyproject.toml), exactly as a
third-party pack would be."""

# Importing a pack module first must still load lazyx.core (and so every pack) in
# the right order: the CPU kernels refer to the packs' primitive classes.
import lazyx.core  # noqa: E402,F401
