"""The Python half of the launcher: what entrypoint.py does before it hands a config to Megatron Bridge."""
