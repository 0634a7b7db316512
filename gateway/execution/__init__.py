"""Running code on a kernel: the kernel client, output caps, the recorder."""
