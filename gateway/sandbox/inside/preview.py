"""The preview forwarder: runs in a sandbox, so a viewer reaches its ports without inbound network.

The sandbox has no network a viewer could connect to. The gateway listens on
a Unix socket in the session's run directory (``/run/sbx/preview.sock``
inside); this process keeps a control connection to it (its first line
``control``). On ``open <id> <port>`` it connects to ``127.0.0.1:<port>``
(or ``::1``), opens a new connection to the socket whose first line is
``data <id>``, and pipes the two; ``refused <id>`` if nothing listens there.
On ``ports`` it answers ``ports <p>,<p>...``: the TCP ports listening in the
sandbox (``/proc/net/tcp`` and ``tcp6``). The gateway starts it with
``docker exec`` as the sandbox's own user (``python3 -c``: standard library
only), and again once it has gone; it ends when the control connection does.
"""

import socket
import sys
import threading

SOCKET = "/run/sbx/preview.sock"
CHUNK = 65536


def pipe(source, sink):
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    for end in (sink, source):
        try:
            end.shutdown(socket.SHUT_RDWR if end is source else socket.SHUT_WR)
        except OSError:
            pass


def listening():
    found = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as table:
                next(table)
                for row in table:
                    fields = row.split()
                    if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                        found.add(int(fields[1].rsplit(":", 1)[1], 16))
        except (OSError, ValueError, StopIteration):
            pass
    found.discard(0)
    return sorted(found)[:512]


def connect_local(port):
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        local = socket.socket(family)
        try:
            local.connect((host, port))
            return local
        except OSError:
            local.close()
    return None


def open_one(ident, port, control):
    local = connect_local(port)
    if local is None:
        control.sendall(f"refused {ident}\n".encode())
        return
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect(SOCKET)
        upstream.sendall(f"data {ident}\n".encode())
    except OSError:
        local.close()
        upstream.close()
        return
    for ends in ((local, upstream), (upstream, local)):
        threading.Thread(target=pipe, args=ends, daemon=True).start()


def main():
    control = socket.socket(socket.AF_UNIX)
    control.connect(SOCKET)
    control.sendall(b"control\n")
    lock = threading.Lock()

    class Locked:  # one line at a time on the control connection, from any thread
        def sendall(self, data):
            with lock:
                control.sendall(data)

    said = Locked()
    for line in control.makefile("rb"):
        words = line.decode("ascii", "replace").split()
        if words[:1] == ["ports"]:
            said.sendall(("ports " + ",".join(map(str, listening())) + "\n").encode())
        elif len(words) == 3 and words[0] == "open" and words[2].isdigit():
            args = (words[1], int(words[2]), said)
            threading.Thread(target=open_one, args=args, daemon=True).start()
    sys.exit(0)


if __name__ == "__main__":
    main()
