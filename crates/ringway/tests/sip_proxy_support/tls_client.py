#!/usr/bin/env python3
"""A SIP-over-TLS probe for the sip_proxy_tls tests (Python's ssl module).

    tls_client.py HOST PORT CA [--sni NAME] [--max-version 1.0|1.1|1.2|1.3]
                  [--hold]

Connects, prints `cert CN` (the server certificate's common name, verified
with CA) and `version V`, sends OPTIONS and prints `status CODE`. With
--hold it then waits for a line on stdin and sends OPTIONS again over the
same connection (`status CODE` again), until stdin closes. A failed
handshake prints `handshake-error TEXT` and exits 2.
"""
import argparse
import socket
import ssl
import sys
import uuid
import warnings

warnings.simplefilter("ignore", DeprecationWarning)

p = argparse.ArgumentParser()
p.add_argument("host")
p.add_argument("port", type=int)
p.add_argument("ca")
p.add_argument("--sni")
p.add_argument("--max-version", default="1.3")
p.add_argument("--hold", action="store_true")
a = p.parse_args()

versions = {
    "1.0": ssl.TLSVersion.TLSv1,
    "1.1": ssl.TLSVersion.TLSv1_1,
    "1.2": ssl.TLSVersion.TLSv1_2,
    "1.3": ssl.TLSVersion.TLSv1_3,
}
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(a.ca)
ctx.check_hostname = a.sni is not None
if not ctx.check_hostname:
    ctx.verify_mode = ssl.CERT_REQUIRED
# Offer exactly the versions asked for: the old ones too (security level 0,
# or this client would refuse TLS 1.0/1.1 itself and test nothing).
ctx.minimum_version = min(versions[a.max_version], ssl.TLSVersion.TLSv1_2)
if versions[a.max_version] < ssl.TLSVersion.TLSv1_2:
    ctx.minimum_version = ssl.TLSVersion.TLSv1
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
ctx.maximum_version = versions[a.max_version]

raw = socket.create_connection((a.host, a.port), timeout=10)
try:
    s = ctx.wrap_socket(raw, server_hostname=a.sni)
except (ssl.SSLError, OSError) as e:
    print(f"handshake-error {e}", flush=True)
    sys.exit(2)
cn = dict(x[0] for x in s.getpeercert()["subject"])["commonName"]
print(f"cert {cn}", flush=True)
print(f"version {s.version()}", flush=True)
local = s.getsockname()


def options():
    branch = "z9hG4bK" + uuid.uuid4().hex
    msg = (
        f"OPTIONS sip:{a.host}:{a.port};transport=tls SIP/2.0\r\n"
        f"Via: SIP/2.0/TLS {local[0]}:{local[1]};branch={branch}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:probe@{a.host}>;tag=1\r\n"
        f"To: <sip:{a.host}>\r\n"
        f"Call-ID: {uuid.uuid4().hex}@probe\r\n"
        "CSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    s.sendall(msg.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            print("closed", flush=True)
            sys.exit(3)
        data += chunk
    print("status " + data.split(b" ", 2)[1].decode(), flush=True)


options()
if a.hold:
    for _ in sys.stdin:
        options()
