"""What a launch saves, and how often: Megatron Bridge's checkpoints with defaults that keep the user's work."""
