"""The kernel transport: how the gateway's bytes reach a kernel's sockets and back.

``wire`` (ZMTP frame headers and the bounds a message keeps), ``zmtp`` (the
gateway's own ZMTP links to a local kernel's Unix sockets), ``libzmq`` (the
shared libzmq context and ``ZmqLink``, for kernels elsewhere and the Jupyter
relays), ``guard`` (a relay before a kernel socket that cuts an oversized
message; the docker placement is handed it by ``app``), ``drops`` (libzmq
connections dropped for good, made again), ``links`` (what the channels need
of any link). Nothing here knows a session, a request or HTTP.
"""
