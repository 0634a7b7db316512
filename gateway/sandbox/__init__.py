"""Where and how kernels run: the sandbox interface, images, isolation, Docker and Swarm."""
