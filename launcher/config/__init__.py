"""The rank side of a launch: NAME=VALUE overrides, the checks of the resolved config and its data, and its outputs."""
