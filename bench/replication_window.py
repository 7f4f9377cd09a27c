#!/usr/bin/env python3
"""How many acknowledged writes a SIGKILL of a Redis primary loses (bench/cluster.md §6).

Starts a primary and a replica on loopback (no persistence), waits for the replication link,
writes SET k<i> 1 as fast as one connection can (one command at a time, then pipelines of 64),
counts the writes the primary acknowledged, SIGKILLs the primary at a random moment 1-2 s in,
and counts the keys the replica holds: acknowledged writes it lacks are what a failover would
have lost without WAIT. Plain Redis replication, nothing of wxguard's: it measures the window
that guard.wait.replicas closes.

    bench/replication_window.py [--kills N]

Stops what it started by PID; every wait is bounded.
"""
import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(port, workdir, replicaof=None):
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
            "--save", "", "--appendonly", "no", "--logfile", os.path.join(workdir, "log")]
    if replicaof:
        args += ["--replicaof", "127.0.0.1", str(replicaof)]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"redis-server on {port} did not start")


def request(sock, reader, *args):
    sock.sendall(b"".join([b"*%d\r\n" % len(args)] +
                          [b"$%d\r\n%s\r\n" % (len(a), a) for a in args]))
    line = reader.readline()
    if line[:1] == b"$":
        return reader.read(int(line[1:]) + 2)
    return line


def one_kill(pipeline, root):
    pa, pb = free_port(), free_port()
    dp, dr = os.path.join(root, f"p{pa}"), os.path.join(root, f"r{pb}")
    os.makedirs(dp)
    os.makedirs(dr)
    primary = start(pa, dp)
    replica = start(pb, dr, pa)
    try:
        rs = socket.create_connection(("127.0.0.1", pb), 5)
        rf = rs.makefile("rb")
        for _ in range(300):  # a diskless first sync waits 5 s for more replicas
            if b"master_link_status:up" in request(rs, rf, b"INFO", b"replication"):
                break
            time.sleep(0.1)
        else:
            raise SystemExit("the replica's link never came up")
        s = socket.create_connection(("127.0.0.1", pa), 5)
        f = s.makefile("rb")

        def killer():
            time.sleep(1.0 + random.random())
            os.kill(primary.pid, signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()
        acked, t0 = 0, time.time()
        try:
            while time.time() - t0 < 10:
                s.sendall(b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$1\r\n1\r\n" %
                                   (len(b"k%d" % i), i) for i in range(acked, acked + pipeline)))
                for _ in range(pipeline):
                    if not f.readline():
                        raise EOFError
                    acked += 1
        except (EOFError, OSError):
            pass
        rate = acked / (time.time() - t0)
        primary.wait(10)
        time.sleep(0.3)
        present = int(request(rs, rf, b"DBSIZE")[1:])
        return acked, present, rate
    finally:
        for proc in (primary, replica):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=5)
    opts = ap.parse_args()
    random.seed(1)
    root = tempfile.mkdtemp(prefix="wxg-replwin.")
    try:
        print("| pipeline | writes acknowledged | writes/s | on the replica | lost |")
        print("|---:|---:|---:|---:|---:|")
        for pipeline in (1, 64):
            for _ in range(opts.kills):
                acked, present, rate = one_kill(pipeline, root)
                print(f"| {pipeline} | {acked} | {rate:.0f} | {present} | "
                      f"{max(0, acked - present)} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
