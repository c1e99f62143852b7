"""What a rank imports: the packages' own training path, and of the model bridges only the one hf_path needs."""
