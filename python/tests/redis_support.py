"""A real redis-server on 127.0.0.1 for the Python tests (no persistence, a fresh --dir), and a
minimal RESP client to look at and tamper with what a tier stored."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class RedisServer:
    def __init__(self, cluster=False):
        """cluster: cluster mode, its config file in the fresh --dir and the cluster bus on a free
        port of its own (a client port above 55535 has no +10000 one)."""
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH: run scripts/install-deps.sh")
        self.dir = tempfile.mkdtemp(prefix="tessera-redis-")
        self.proc = None
        self.bus_port = None
        for _ in range(8):
            self.port = _free_port()
            args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                    "no", "--dir", self.dir, "--loglevel", "warning"]
            if cluster:
                self.bus_port = _free_port()
                while self.bus_port == self.port:
                    self.bus_port = _free_port()
                args += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(self.dir, "nodes.conf"),
                         "--cluster-port", str(self.bus_port), "--cluster-require-full-coverage", "no"]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._wait_up():
                return
            self.stop()
        raise RuntimeError("redis-server never answered")

    def _wait_up(self):
        mine = ("process_id:%d\r\n" % self.proc.pid).encode()
        for _ in range(500):
            if self.proc.poll() is not None:
                return False
            try:
                if mine in self.command("INFO", "server"):
                    return True
            except OSError:
                pass
            time.sleep(0.01)
        return False

    def command(self, *args):
        """One command; the reply as bytes (bulk/simple), int, list or None."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            out = b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(out)
            f = s.makefile("rb")
            return self._read(f)

    def _read(self, f):
        line = f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._read(f) for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """Three redis-server processes in cluster mode on 127.0.0.1, one master per third of the
    slots (as tests/redis_cluster_test.cc forms its cluster): slots assigned, nodes introduced,
    ready once every node reports cluster_state:ok with all 16384 slots and 3 nodes known."""

    RANGES = ((0, 5460), (5461, 10922), (10923, 16383))

    def __init__(self):
        self.nodes = []
        try:
            for _ in range(3):
                self.nodes.append(RedisServer(cluster=True))
            for i, (n, (lo, hi)) in enumerate(zip(self.nodes, self.RANGES)):
                n.command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                n.command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for n in self.nodes[1:]:
                self.nodes[0].command("CLUSTER", "MEET", "127.0.0.1", n.port, n.bus_port)
            deadline = time.monotonic() + 10
            for n in self.nodes:
                while True:
                    info = n.command("CLUSTER", "INFO")
                    if (b"cluster_state:ok" in info and b"cluster_slots_assigned:16384" in info
                            and b"cluster_known_nodes:3" in info):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("node %d never reported cluster_state:ok" % n.port)
                    time.sleep(0.02)
        except BaseException:
            self.close()
            raise

    def seeds(self):
        """The seed list a client is given: two of the three nodes."""
        return ",".join("127.0.0.1:%d" % n.port for n in self.nodes[:2])

    def dbsizes(self):
        return [n.command("DBSIZE") for n in self.nodes]

    def stop(self):
        for n in self.nodes:
            n.stop()

    def close(self):
        for n in self.nodes:
            n.close()
