"""sandbox-gateway's Python SDK on its own: ``from sbx_client import Session``.

The same SDK as the server's ``gateway.client`` (``sbx_client.client`` is that
source), under a name of its own so both distributions install side by side.
"""

# isort: off
from .version import __version__ as __version__  # first: the SDK reads it from the root
from .client import *  # noqa: F403
from .client import __all__ as __all__
