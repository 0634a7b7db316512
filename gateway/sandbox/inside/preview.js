// The preview forwarder for images with node and no python3: preview.py's protocol, in Node.
// Control connection: "control"; on "open <id> <port>" a connection to the sandbox's loopback
// port, piped to a new connection to the socket that says "data <id>" ("refused <id>" if none);
// on "ports" the listening TCP ports. Ends when the control connection does.
const net = require("net");
const fs = require("fs");

const SOCKET = "/run/sbx/preview.sock";

function listening() {
  const found = new Set();
  for (const name of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text = "";
    try { text = fs.readFileSync(name, "latin1"); } catch { continue; }
    for (const row of text.split("\n").slice(1)) {
      const fields = row.trim().split(/\s+/);
      if (fields.length > 3 && fields[3] === "0A") found.add(parseInt(fields[1].split(":").pop(), 16));
    }
  }
  found.delete(0);
  return [...found].sort((a, b) => a - b).slice(0, 512);
}

function connectLocal(port, done) {
  const hosts = ["127.0.0.1", "::1"];
  const attempt = (i) => {
    if (i >= hosts.length) { done(null); return; }
    const local = net.connect(port, hosts[i]);
    local.once("connect", () => { local.removeAllListeners("error"); done(local); });
    local.once("error", () => { local.destroy(); attempt(i + 1); });
  };
  attempt(0);
}

function open(ident, port, control) {
  connectLocal(port, (local) => {
    if (local === null) { control.write(`refused ${ident}\n`); return; }
    const upstream = net.connect(SOCKET);
    upstream.write(`data ${ident}\n`);
    local.pipe(upstream);
    upstream.pipe(local);
    for (const end of [local, upstream]) {
      end.on("error", () => { local.destroy(); upstream.destroy(); });
    }
  });
}

const control = net.connect(SOCKET);
control.write("control\n");
let pending = "";
control.on("data", (chunk) => {
  pending += chunk.toString("latin1");
  let end;
  while ((end = pending.indexOf("\n")) >= 0) {
    const words = pending.slice(0, end).split(" ");
    pending = pending.slice(end + 1);
    if (words[0] === "ports") {
      control.write(`ports ${listening().join(",")}\n`);
    } else if (words.length === 3 && words[0] === "open" && /^\d+$/.test(words[2])) {
      open(words[1], Number(words[2]), control);
    }
  }
});
control.on("close", () => process.exit(0));
control.on("error", () => process.exit(1));
