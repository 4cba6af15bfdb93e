# A Python actor holding a big dict in memory behind a tiny HTTP server:
# GET / counts requests and shows a sample entry, GET /readyz does not
# count. Standard library only (socket), so its image stays small.
import os
import socket

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
         "kilo lima mike november oscar papa quebec romeo sierra tango").split()


def fill(n):
    d = {}
    for i in range(n):
        r = os.urandom(24)
        d["user:%d" % i] = ('{"id": %d, "token": "%s", "name": "%s %s", '
                            '"note": "%s %s %s %s", "score": %d}') % (
            i, r[:16].hex(), WORDS[r[16] % 20], WORDS[r[17] % 20],
            WORDS[r[18] % 20], WORDS[r[19] % 20], WORDS[r[20] % 20],
            WORDS[r[21] % 20], r[22] * r[23])
    return d


def main():
    entries = fill(int(os.environ.get("ENTRIES", "1000")))
    count = 0
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(os.environ.get("PORT", "8080"))))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        req = b""
        while b"\r\n\r\n" not in req:
            chunk = conn.recv(4096)
            if not chunk:
                break
            req += chunk
        if req.count(b" ") < 2:
            # A connection that asked nothing (a port check): not a request.
            conn.close()
            continue
        path = req.split(b" ", 2)[1]
        if path == b"/readyz":
            body = b"ok"
        else:
            count += 1
            body = ("count=%d entries=%d sample=%s" % (count, len(entries), entries["user:%d" % (len(entries) // 2)])).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        conn.close()


main()
