"""Captures every frame on the loopback interface while a command runs, for tests that check what
crosses the wire (tests/scripts/wire_secret.sh).

Usage: lo_capture.py OUT -- COMMAND [ARG...]
Writes the captured frames, concatenated, to OUT and exits with the command's status. Needs
CAP_NET_RAW (root): without it, exits 77 (the tests' skip code) with the reason. At most 512 MiB
is kept; the capture stops at the command's end (bounded by the command's own timeout).
"""

import socket
import subprocess
import sys
import threading

ETH_P_ALL = 0x0003
LIMIT = 512 << 20


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print("usage: lo_capture.py OUT -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    out, command = sys.argv[1], sys.argv[3:]
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind(("lo", 0))
    except (PermissionError, OSError) as e:
        print(f"skip: cannot capture on lo ({e}); needs root or CAP_NET_RAW", file=sys.stderr)
        return 77
    sock.settimeout(0.2)
    frames: list[bytes] = []
    kept = [0]
    done = threading.Event()

    def capture() -> None:
        while not done.is_set():
            try:
                frame = sock.recv(1 << 16)
            except TimeoutError:
                continue
            if kept[0] + len(frame) <= LIMIT:
                frames.append(frame)
                kept[0] += len(frame)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    try:
        rc = subprocess.call(command)
    finally:
        done.set()
        thread.join(timeout=5)
        sock.close()
    with open(out, "wb") as f:
        f.write(b"".join(frames))
    print(f"captured {len(frames)} frames, {kept[0]} bytes on lo", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
