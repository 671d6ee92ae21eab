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
    def __init__(self):
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH: run scripts/install-deps.sh")
        self.dir = tempfile.mkdtemp(prefix="tessera-redis-")
        self.proc = None
        for _ in range(8):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                 "no", "--dir", self.dir, "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
