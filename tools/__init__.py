"""Developer tools: generators of committed files (`make docs`)."""
