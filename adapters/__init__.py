"""How a submission is found, loaded and run: discovery, the isolated runner and its client."""
