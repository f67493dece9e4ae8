"""Bulk TCP flows for the emulated-cluster tests: how fast bytes cross a shaped link.

  tcp_flow.py recv PORT SENDERS   accepts SENDERS connections, reads each to its end, prints
                                  "BYTES SECONDS" (first byte to last end, all flows together)
  tcp_flow.py send ADDR PORT BYTES   connects (retrying for up to 10 s) and sends BYTES

Every socket wait is bounded (30 s).
"""

import socket
import sys
import threading
import time

TIMEOUT_S = 30.0


def recv(port: int, senders: int) -> None:
    server = socket.create_server(("0.0.0.0", port))
    server.settimeout(TIMEOUT_S)
    first = [None]
    totals = []
    lock = threading.Lock()

    def drain(conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT_S)
        got = 0
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            with lock:
                if first[0] is None:
                    first[0] = time.monotonic()
            got += len(chunk)
        with lock:
            totals.append(got)
        conn.close()

    threads = []
    for _ in range(senders):
        conn, _ = server.accept()
        t = threading.Thread(target=drain, args=(conn,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(TIMEOUT_S)
    end = time.monotonic()
    if len(totals) != senders:
        sys.exit(
            f"tcp_flow recv: {senders - len(totals)} flow(s) did not end within {TIMEOUT_S} s"
        )
    print(sum(totals), f"{end - first[0]:.6f}")


def send(addr: str, port: int, size: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=TIMEOUT_S)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    block = b"\0" * (1 << 20)
    left = size
    while left > 0:
        n = min(left, len(block))
        conn.sendall(block[:n])
        left -= n
    conn.close()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "recv":
        recv(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "send":
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
