"""domo: the Majordomo Protocol family, exact to the spec.

``domo.protocol`` holds the sans-IO state machines (no sockets, no clock); ``domo.trio`` drives
them over ZeroMQ with Trio; ``domo.cli`` is the ``domo`` command.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
