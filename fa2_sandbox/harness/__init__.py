"""The grader side of the trust boundary: discovery, the sandbox and the runner client."""
