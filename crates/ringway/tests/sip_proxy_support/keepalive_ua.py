#!/usr/bin/env python3
"""A phone for the keepalive tests of sip_proxy_keepalive.rs.

udp PROXY PORT ANSWER: registers over UDP from 127.0.0.1:PORT with a
private Contact (so the registrar takes it as behind NAT), answers the
first ANSWER keepalive OPTIONS with 200 and then only counts them; prints
"registered", "answered N" and "ignored N" lines as it goes, for 60 s.

tcp PROXY: registers over one TCP connection, prints "registered", then
waits for a line on stdin and closes the connection.

stun PROXY PORT: sends an RFC 5389 Binding request from 127.0.0.1:PORT
and prints the XOR-MAPPED-ADDRESS of the answer ("mapped IP:PORT").
"""
import socket
import struct
import sys
import time


def register(transport, proxy, local, call_id):
    host, port = local
    return (
        f"REGISTER sip:ringway.test SIP/2.0\r\n"
        f"Via: SIP/2.0/{transport} {host}:{port};branch=z9hG4bK-{call_id};rport\r\n"
        f"Max-Forwards: 70\r\n"
        f"From: <sip:{call_id}@ringway.test>;tag=t-{call_id}\r\n"
        f"To: <sip:{call_id}@ringway.test>\r\n"
        f"Call-ID: {call_id}@test\r\n"
        f"CSeq: 1 REGISTER\r\n"
        f"Contact: <sip:{call_id}@10.11.12.13:5060;transport={transport.lower()}>\r\n"
        f"Expires: 300\r\n"
        f"Content-Length: 0\r\n\r\n"
    ).encode()


def answer(request):
    lines = request.decode(errors="replace").split("\r\n")
    keep = [l for l in lines[1:] if l.split(":")[0].lower() in ("via", "from", "call-id", "cseq")]
    to = [l for l in lines[1:] if l.lower().startswith("to:")]
    out = ["SIP/2.0 200 OK"] + keep + [to[0] + ";tag=ua"] + ["Content-Length: 0", "", ""]
    return "\r\n".join(out).encode()


def udp(proxy, port, answer_count):
    s = socket.socket(socket.AF_INET6 if ":" in proxy[0] else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("::1" if ":" in proxy[0] else "127.0.0.1", port))
    s.settimeout(1.0)
    s.sendto(register("UDP", proxy, s.getsockname()[:2], "alice"), proxy)
    answered = ignored = 0
    end = time.time() + 60
    while time.time() < end:
        try:
            data, src = s.recvfrom(65535)
        except socket.timeout:
            continue
        if data.startswith(b"SIP/2.0 200") and b"REGISTER" in data:
            print("registered", flush=True)
        elif data.startswith(b"OPTIONS "):
            if answered < answer_count:
                s.sendto(answer(data), src)
                answered += 1
                print(f"answered {answered}", flush=True)
            else:
                ignored += 1
                print(f"ignored {ignored}", flush=True)


def tcp(proxy):
    s = socket.create_connection(proxy, timeout=10)
    s.sendall(register("TCP", proxy, s.getsockname()[:2], "bob"))
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("connection closed before the 200")
        data += chunk
    if not data.startswith(b"SIP/2.0 200"):
        sys.exit(f"REGISTER answered {data[:40]!r}")
    print("registered", flush=True)
    sys.stdin.readline()
    s.close()
    print("closed", flush=True)


def stun(proxy, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))
    s.settimeout(5.0)
    txid = b"ringway-stun"
    # A SOFTWARE attribute: the request is as long as the answer.
    software = struct.pack("!HH", 0x8022, 8) + b"ringway!"
    s.sendto(struct.pack("!HHI", 1, len(software), 0x2112A442) + txid + software, proxy)
    data, _ = s.recvfrom(2048)
    kind, length, cookie = struct.unpack("!HHI", data[:8])
    assert (kind, cookie, data[8:20]) == (0x0101, 0x2112A442, txid), data
    attr, alen, _, family, xport = struct.unpack("!HHBBH", data[20:28])
    assert (attr, family) == (0x20, 1), data
    ip = bytes(b ^ c for b, c in zip(data[28:32], struct.pack("!I", 0x2112A442)))
    print(f"mapped {socket.inet_ntoa(ip)}:{xport ^ 0x2112}", flush=True)


def main():
    kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    proxy = (host, port)
    if kind == "udp":
        udp(proxy, int(sys.argv[4]), int(sys.argv[5]))
    elif kind == "tcp":
        tcp(proxy)
    else:
        stun(proxy, int(sys.argv[4]))


if __name__ == "__main__":
    main()
