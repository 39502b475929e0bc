#!/usr/bin/env python3
"""A SIP-over-WebSocket client (RFC 7118) for the sip_proxy_ws tests: the
HTTP upgrade and RFC 6455 frames by hand (masked, as a browser sends them).

    ws_client.py HOST PORT [--ca CA] [--origin O] [--protocol P] MODE

MODE:
  upgrade          print the HTTP status code of the answer (`http CODE`)
  unmasked         upgrade, send an unmasked frame, print `close CODE`
  ua USER DOMAIN   upgrade, ping (`pong`), REGISTER (`registered CODE`),
                   then answer one call: 200 to INVITE (`invite`), wait
                   for ACK (`ack`), 200 to BYE (`bye`), and exit.
With --ca the connection is TLS (wss), verified with CA. In ua mode,
--invalid registers a Contact at a random `.invalid` host as browsers do
(reachable only over this connection), --supported VALUE adds a Supported
header (with `outbound` the Contact gets +sip.instance and reg-id), and
each Path of the 200 to the REGISTER is printed (`path VALUE`).
"""
import argparse
import base64
import os
import socket
import ssl
import struct
import sys
import uuid

p = argparse.ArgumentParser()
p.add_argument("host")
p.add_argument("port", type=int)
p.add_argument("--ca")
p.add_argument("--origin", default="https://phone.test")
p.add_argument("--protocol", default="sip")
p.add_argument("--invalid", action="store_true")
p.add_argument("--supported")
p.add_argument("mode")
p.add_argument("rest", nargs="*")
a = p.parse_args()

raw = socket.create_connection((a.host, a.port), timeout=20)
if a.ca:
    ctx = ssl.create_default_context(cafile=a.ca)
    ctx.check_hostname = False
    s = ctx.wrap_socket(raw)
else:
    s = raw
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((
    f"GET /sip HTTP/1.1\r\nHost: {a.host}:{a.port}\r\nUpgrade: websocket\r\n"
    f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    f"Sec-WebSocket-Protocol: {a.protocol}\r\nOrigin: {a.origin}\r\n\r\n").encode())
buf = b""
while b"\r\n\r\n" not in buf:
    chunk = s.recv(4096)
    if not chunk:
        break
    buf += chunk
head, _, buf = buf.partition(b"\r\n\r\n")
code = head.split(b" ", 2)[1].decode() if head else "none"
if a.mode == "upgrade":
    print(f"http {code}", flush=True)
    sys.exit(0)
assert code == "101", head
import hashlib  # noqa: E402

want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
assert b"Sec-WebSocket-Accept: " + want in head, head
assert b"Sec-WebSocket-Protocol: sip" in head, head


def send(opcode, payload, masked=True):
    n = len(payload)
    h = bytes([0x80 | opcode])
    m = 0x80 if masked else 0
    if n < 126:
        h += bytes([m | n])
    elif n < 65536:
        h += bytes([m | 126]) + struct.pack(">H", n)
    else:
        h += bytes([m | 127]) + struct.pack(">Q", n)
    if masked:
        mask = os.urandom(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        h += mask
    s.sendall(h + payload)


def recv_exact(n):
    global buf
    while len(buf) < n:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError
        buf += chunk
    out, buf = buf[:n], buf[n:]
    return out


def frame():
    b0, b1 = recv_exact(2)
    assert b1 & 0x80 == 0, "server frames are not masked"
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", recv_exact(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", recv_exact(8))[0]
    return b0 & 0x0F, recv_exact(n)


if a.mode == "unmasked":
    send(1, b"OPTIONS sip:x SIP/2.0\r\n\r\n", masked=False)
    op, payload = frame()
    print(f"close {struct.unpack('>H', payload[:2])[0] if op == 8 else 'none'}", flush=True)
    sys.exit(0)

user, domain = a.rest
local = f"{uuid.uuid4().hex[:10]}.invalid"
# Via names a .invalid host as browsers do; the Contact names the
# connection's address, or with --invalid a .invalid host too (in-dialog
# requests to it then need the flow token of the proxy's Record-Route).
here = local if a.invalid else "%s:%d" % s.getsockname()[:2]
transport = "WSS" if a.ca else "WS"
contact_params = ""
supported = ""
if a.supported:
    supported = f"Supported: {a.supported}\r\n"
    if "outbound" in a.supported:
        contact_params = f';+sip.instance="<urn:uuid:{uuid.uuid4()}>";reg-id=1'

send(9, b"hello")
op, payload = frame()
print("pong" if (op, payload) == (10, b"hello") else f"op {op}", flush=True)
call_id = uuid.uuid4().hex
send(1, (
    f"REGISTER sip:{domain} SIP/2.0\r\n"
    f"Via: SIP/2.0/{transport} {local};branch=z9hG4bK{uuid.uuid4().hex}\r\n"
    "Max-Forwards: 70\r\n"
    f"From: <sip:{user}@{domain}>;tag=ws1\r\nTo: <sip:{user}@{domain}>\r\n"
    f"Call-ID: {call_id}\r\nCSeq: 1 REGISTER\r\n"
    f"Contact: <sip:{user}@{here};transport={transport.lower()}>{contact_params}\r\n{supported}"
    "Expires: 600\r\nContent-Length: 0\r\n\r\n").encode())


def headers(msg):
    lines = msg.split("\r\n\r\n", 1)[0].split("\r\n")
    return lines[0], lines[1:]


def answer(msg, code, reason, body=""):
    start, hs = headers(msg)
    keep = [h for h in hs if h.split(":", 1)[0].strip().lower() in
            ("via", "v", "from", "f", "call-id", "i", "cseq", "record-route")]
    out = []
    for h in hs:
        if h.split(":", 1)[0].strip().lower() in ("to", "t"):
            out.append(h if ";tag=" in h else h + ";tag=wsua")
    extra = "Content-Type: application/sdp\r\n" if body else ""
    return (f"SIP/2.0 {code} {reason}\r\n" + "\r\n".join(keep + out) +
            f"\r\nContact: <sip:{user}@{here};transport={transport.lower()}>\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n{body}").encode()


SDP = "v=0\r\no=ws 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\n"
while True:
    op, payload = frame()
    if op == 8:
        print("closed", flush=True)
        sys.exit(1)
    if op not in (1, 2):
        continue
    msg = payload.decode(errors="replace")
    start = msg.split("\r\n", 1)[0]
    if start.startswith("SIP/2.0 ") and "REGISTER" in msg:
        print(f"registered {start.split(' ')[1]}", flush=True)
        for h in headers(msg)[1]:
            name, _, value = h.partition(":")
            if name.strip().lower() == "path":
                print(f"path {value.strip()}", flush=True)
    elif start.startswith("INVITE "):
        print("invite", flush=True)
        send(1, answer(msg, 200, "OK", SDP))
    elif start.startswith("ACK "):
        print("ack", flush=True)
    elif start.startswith("BYE "):
        send(1, answer(msg, 200, "OK"))
        print("bye", flush=True)
        sys.exit(0)
