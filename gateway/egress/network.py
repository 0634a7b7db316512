"""The internal Docker network allowlist sessions join, and the firewall around it.

An internal bridge network with inter-container traffic disabled: a kernel on
it reaches neither the outside world nor other kernels. What it can still
reach is the host end of the bridge, where the egress proxy listens, and with
it every host service bound to all addresses. Host firewall rules (iptables,
so this needs root) close that: from the bridge, only TCP to the proxy ports
on the bridge address is accepted, and nothing is forwarded anywhere, whatever
Docker's own rules say. The network and the rules are shared by every gateway
on the host (so they must agree on ``egress_proxy_ports``) and kept when a
gateway stops, like its images; ensuring them again rewrites the same rules.
Blocking calls: run in a thread.
"""

from __future__ import annotations

import shutil
import subprocess

import docker
import docker.errors

from ..errors import EgressUnavailable

LABEL = "sbx.egress"
_OPTIONS = {
    "com.docker.network.bridge.enable_icc": "false",
    "com.docker.network.bridge.enable_ip_masquerade": "false",
}


class EgressNetwork:
    """Ensures the network ``name`` (bridge device of the same name) and its firewall."""

    def __init__(self, client: docker.DockerClient, name: str, ports: range) -> None:
        self.client = client
        self.name = name
        self.ports = ports
        self.chain = f"SBX-{name}"[:28]

    def ensure(self) -> str:
        """Create what is missing; return the bridge's host address (where the proxy listens)."""
        if not (shutil.which("iptables") and shutil.which("iptables-restore")):
            raise EgressUnavailable(
                "egress allowlists need iptables on the host to fence the egress network; "
                "install it (Debian: iptables) or use network 'none'"
            )
        network = self._network()
        config = network.attrs["IPAM"]["Config"]
        gateway = next((c["Gateway"] for c in config if ":" not in c.get("Gateway", ":")), None)
        if gateway is None:
            raise EgressUnavailable(f"Docker network {self.name} has no IPv4 gateway address")
        self._firewall(gateway)
        return gateway

    def _network(self) -> docker.models.networks.Network:
        try:
            network = self.client.networks.get(self.name)
        except docker.errors.NotFound:
            try:
                return self.client.networks.create(
                    self.name,
                    driver="bridge",
                    internal=True,
                    options={**_OPTIONS, "com.docker.network.bridge.name": self.name},
                    labels={LABEL: "1"},
                )
            except docker.errors.APIError as e:
                if e.status_code != 409:  # 409: another gateway created it just now
                    raise EgressUnavailable(f"cannot create network {self.name}: {e}") from e
                network = self.client.networks.get(self.name)
        options = network.attrs.get("Options") or {}
        isolated = all(options.get(k) == v for k, v in _OPTIONS.items())
        if not network.attrs.get("Internal") or not isolated:
            raise EgressUnavailable(
                f"Docker network {self.name} exists but is not the gateway's internal, "
                "isolated network; remove it or set another egress_network"
            )
        return network

    def _firewall(self, address: str) -> None:
        # The chain is declared, so flushed and refilled in one atomic commit.
        ports = f"{self.ports.start}:{self.ports.stop - 1}"
        rules = "\n".join(
            [
                "*filter",
                f":{self.chain} - [0:0]",
                f"-A {self.chain} -d {address}/32 -p tcp --dport {ports} -j ACCEPT",
                f"-A {self.chain} -j REJECT --reject-with icmp-admin-prohibited",
                "COMMIT",
                "",
            ]
        )
        self._iptables_run(["iptables-restore", "-w", "--noflush"], rules)
        self._ensure("INPUT", ["-i", self.name, "-j", self.chain])
        self._ensure("FORWARD", ["-i", self.name, "-j", "REJECT"])

    def _ensure(self, chain: str, rule: list[str]) -> None:
        """Put ``rule`` first in ``chain`` unless it is there already."""
        check = subprocess.run(["iptables", "-w", "-C", chain, *rule], capture_output=True)
        if check.returncode != 0:
            self._iptables_run(["iptables", "-w", "-I", chain, *rule])

    @staticmethod
    def _iptables_run(cmd: list[str], stdin: str | None = None) -> None:
        result = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
        if result.returncode != 0:
            raise EgressUnavailable(
                f"cannot set the egress firewall ({' '.join(cmd)}): "
                f"{result.stderr.strip()}; the gateway must run as root"
            )
