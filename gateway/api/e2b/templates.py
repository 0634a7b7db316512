"""E2B template names and code languages, mapped onto the gateway's kernels.

E2B builds a VM image per template; here a template picks a kernelspec (and so
its image, ``kernels/*/kernel.json``). A kernelspec's own name is a template too.
"""

from __future__ import annotations

# What the SDK's defaults and E2B's public templates ask for, by kernel.
TEMPLATES = {
    "code-interpreter-v1": "python3",  # e2b_code_interpreter.Sandbox's default
    "code-interpreter": "python3",
    "base": "python3",  # e2b.Sandbox's default
    "mcp-gateway": "python3",  # e2b.Sandbox's default with mcp= (the MCP URL is the gateway's)
    "python": "python3",
    "r": "ir",
    "javascript": "javascript",
    "js": "javascript",
    "nodejs": "javascript",
    "bash": "bash",
}

# run_code / create_code_context languages, by kernel.
LANGUAGES = {"python": "python3", "r": "ir", "javascript": "javascript", "js": "javascript",
             "bash": "bash"}  # fmt: skip

# The SDK's home directory is the session's workspace (where the kernel starts).
HOME = "/home/user"
ENVD_VERSION = "0.5.7"  # the envd the SDK should expect: octet-stream uploads, no file metadata


def kernel_for_template(template: str) -> str:
    return TEMPLATES.get(template, template)


def language_of(kernel: str) -> str:
    """The E2B language a kernel speaks (its first name in ``LANGUAGES``)."""
    return next((lang for lang, k in LANGUAGES.items() if k == kernel), kernel)
