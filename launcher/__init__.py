"""The launcher's parts, a folder per concern (docs/launch.md, "In the code", lists them)."""
