"""Inside the sandbox: the runner and what it imports. Only runner/ and wire/ are trusted there."""
