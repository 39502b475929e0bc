#!/usr/bin/env python3
"""Write the hand-made seed inputs of the fuzz targets into fuzz/corpus/.

Seeds are named `seed-*`; the fuzzer's own finds (named by their SHA-1)
and minimised crash reproducers (`crash-*`) sit beside them. Run from
anywhere; re-running rewrites the seeds only. The SIP torture messages
(RFC 4475/5118) are copied from ../shared/sip-torture when it exists (the
repository keeps its copies, so CI does not need it).

The input languages are described in fuzz/src (sfu_core) and
crates/ringway-sip/src/invariants/script.rs (sip_proxy, sip_dispatch).
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
TORTURE = os.path.join(HERE, "..", "..", "shared", "sip-torture")
if len(sys.argv) > 1:
    TORTURE = sys.argv[1]


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- SIP


def sip(start, headers, body=b""):
    lines = [start] + headers + ["Content-Length: %d" % len(body)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


SDP = (b"v=0\r\no=- 1 1 IN IP4 192.0.2.1\r\ns=-\r\nc=IN IP4 192.0.2.1\r\n"
       b"t=0 0\r\nm=audio 4000 RTP/AVP 0\r\n")


def req(method, uri="sip:bob@example.com", cseq=1, extra=(), body=b"",
        frm="<sip:alice@example.com>;tag=a1", to="<sip:bob@example.com>",
        via="SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKseed1;rport",
        call="seed-1@192.0.2.1"):
    return sip("%s %s SIP/2.0" % (method, uri), [
        "Via: " + via, "Max-Forwards: 70", "From: " + frm, "To: " + to,
        "Call-ID: " + call, "CSeq: %d %s" % (cseq, method),
        "Contact: <sip:alice@192.0.2.1:5060>"] + list(extra), body)


INVITE = req("INVITE", extra=["Content-Type: application/sdp"], body=SDP)
REGISTER = req("REGISTER", uri="sip:example.com", to="<sip:alice@example.com>",
               extra=["Expires: 3600"])
MESSAGES = {
    "invite": INVITE,
    "invite_routes": req("INVITE", extra=["Route: <sip:192.0.2.10;lr>, <sip:192.0.2.30;lr>"]),
    "invite_strict": req("INVITE", uri="sip:192.0.2.10", extra=["Route: <sip:bob@192.0.2.30>"]),
    "invite_ipv6": req("INVITE", uri="sip:bob@[2001:db8::9]:5070"),
    "invite_tel": req("INVITE", uri="tel:+15551234567"),
    "register": REGISTER,
    "register_star": req("REGISTER", uri="sip:example.com", to="<sip:alice@example.com>",
                         extra=["Expires: 0", "Contact: *"]),
    "options_us": req("OPTIONS", uri="sip:192.0.2.10:5060"),
    "bye": req("BYE", cseq=2, to="<sip:bob@example.com>;tag=b1",
               extra=["Route: <sip:192.0.2.10:5060;lr>"]),
    "ack": req("ACK", to="<sip:bob@example.com>;tag=b1"),
    "cancel": req("CANCEL"),
    "mf0": req("OPTIONS", extra=["Max-Forwards: 0"]),
    "proxy_require": req("INVITE", extra=["Proxy-Require: foo"]),
    "compact": b"INVITE sip:bob@example.com SIP/2.0\r\nv: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKc\r\n"
               b"f: <sip:alice@example.com>;tag=1\r\nt: <sip:bob@example.com>\r\ni: c@1\r\n"
               b"CSeq: 1 INVITE\r\nm: <sip:a@192.0.2.1>\r\nl: 0\r\n\r\n",
    "r180": sip("SIP/2.0 180 Ringing", [
        "Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKrw0123456789abcdef.01234567",
        "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKseed1;received=192.0.2.1;rport=5060",
        "From: <sip:alice@example.com>;tag=a1", "To: <sip:bob@example.com>;tag=b1",
        "Call-ID: seed-1@192.0.2.1", "CSeq: 1 INVITE"]),
    "auth_invite": req("INVITE", extra=[
        'Proxy-Authorization: Digest username="alice", realm="example.com", nonce="x", '
        'uri="sip:bob@example.com", response="0123456789abcdef0123456789abcdef", '
        'algorithm=MD5, qop=auth, nc=00000001, cnonce="c"']),
}


def ctl(peer=0, wait=0, kind=0):
    return bytes([peer | wait << 2 | kind << 5])


def script(*steps):
    return b"\xff".join(steps)


RAW, CRED, ANSWER, REPLAY = 0, 1, 2, 3


def answer(code, extra=b"", peer=0, wait=0):
    return ctl(peer, wait, ANSWER) + struct.pack(">H", code - 100) + extra


def unreachable(pick, wait=0):
    """The driver reports an ICMP unreachable (control bit 7) for where the
    core's sent datagram number `pick` (of the last ones) went."""
    return bytes([0x80 | wait << 2, pick])


def proxy_scripts():
    m = MESSAGES
    yield "call", script(ctl() + m["invite"], answer(180), answer(200, b"Contact: <sip:bob@192.0.2.30>\n"),
                         ctl() + m["ack"], ctl(wait=2) + m["bye"], answer(200))
    yield "auth_call", script(ctl() + m["invite"], ctl(kind=CRED) + m["invite"], answer(183),
                              answer(200), ctl() + m["ack"])
    yield "auth_register_then_call", script(
        ctl() + REGISTER, ctl(kind=CRED) + REGISTER,
        ctl(peer=2) + req("INVITE", uri="sip:alice@example.com", frm="<sip:carol@example.net>;tag=c1",
                          to="<sip:alice@example.com>", call="seed-2@192.0.2.30",
                          via="SIP/2.0/UDP 192.0.2.30:5062;branch=z9hG4bKseed2"),
        answer(486), ctl(wait=6) + REGISTER)
    yield "timeout", script(ctl() + m["invite"], ctl(wait=3) + m["invite"], ctl(wait=5) + m["ack"])
    yield "cancel", script(ctl() + m["invite"], answer(180), ctl() + m["cancel"], answer(200),
                           answer(487), ctl() + m["ack"])
    yield "loop", script(ctl() + m["invite"], ctl(kind=REPLAY) + b"\x00", ctl(kind=REPLAY) + b"\x01")
    yield "strict", script(ctl() + m["invite_strict"], answer(200), ctl(peer=3) + m["invite_ipv6"])
    yield "retransmit", script(ctl() + m["options_us"], ctl(wait=1) + m["options_us"],
                               ctl(peer=2) + m["options_us"])
    # The INVITE (sent after the 100 Trying) meets a port unreachable; then
    # one that heard a 180 first, which the report must leave alone.
    yield "unreachable", script(ctl() + m["invite"], unreachable(1), ctl(wait=3) + m["invite"],
                                ctl() + m["ack"])
    yield "unreachable_after_180", script(ctl() + m["invite"], answer(180), unreachable(1),
                                          answer(200), ctl() + m["ack"])
    for name, msg in m.items():
        yield "one_" + name, ctl() + msg


def dispatch_scripts():
    m = MESSAGES
    yield "call", script(ctl() + m["invite"], answer(200, b"Record-Route: <sip:192.0.2.20;lr>\n"),
                         ctl() + m["ack"], ctl(wait=3) + m["bye"], answer(200))
    yield "probes", script(ctl(wait=3) + b"", answer(200), ctl(wait=3) + b"", answer(503),
                           ctl(wait=3) + b"", ctl(wait=3) + b"", ctl(wait=3) + b"", ctl() + m["invite"])
    yield "register_path", script(ctl() + REGISTER, answer(200, b"Path: <sip:192.0.2.10;lr>\n"),
                                  ctl(peer=1) + req("INVITE", uri="sip:alice@192.0.2.1:5060",
                                                    extra=["Route: <sip:192.0.2.10;lr>"],
                                                    via="SIP/2.0/UDP 192.0.2.20;branch=z9hG4bKp1"))
    yield "forged_response", script(ctl(peer=3) + m["r180"], ctl(peer=1) + m["r180"])
    for name, msg in m.items():
        yield "one_" + name, ctl() + msg


# ---------------------------------------------------------------- SFU


def ctrl(ty, req=1, rest=b""):
    return b"PS\x01" + bytes([ty]) + struct.pack(">I", req) + rest


def sfu_wire_seeds():
    yield "register", ctrl(1, rest=bytes(12))
    yield "register_cookie", ctrl(1, rest=bytes(range(12)))
    yield "join", ctrl(2, rest=bytes(range(12)))
    yield "subscribe", ctrl(3, rest=struct.pack(">IQH", 5, 77, 2) + struct.pack(">IB", 0xFFFFFFFF, 0xFF)
                        + struct.pack(">IB", 9, 1))
    yield "keepalive", ctrl(5, rest=struct.pack(">IQ", 5, 77))
    yield "error", ctrl(0x81, rest=bytes([3, 0, 0, 0]) + struct.pack(">I", 5))
    yield "rtp", struct.pack(">BBHII", 0x80, 96, 1, 160, 5) + bytes(160)
    yield "rtp_ext_pad", (struct.pack(">BBHII", 0xB0, 97, 1, 160, 5) + struct.pack(">HH", 0xBEDE, 3)
                          + bytes([0x17]) + struct.pack(">Q", 123456789) + bytes(3) + bytes(20)
                          + bytes([0, 0, 0, 4]))


def sfu_core_seeds():
    # Byte 0: echo flag. Then ops: op, [other], pick, request, args.
    reg = bytes([1 << 3 | 0, 0, 1])            # REGISTER (zero cookie) from peer 0
    join_cookie = bytes([2 << 3 | 0, 0, 2])    # REGISTER with the learnt cookie
    sub_all = bytes([4 << 3 | 0, 0, 3, 1, 0xff, 3])
    rtp = bytes([8 << 3 | 1, 0, 4, 10, 50])    # RTP from peer 1 with client 0's SSID
    yield "register", b"\x00" + reg + join_cookie
    yield "register_subscribe_media", (b"\x01" + reg + join_cookie + bytes([1 << 3 | 1, 0, 1])
                                       + bytes([2 << 3 | 1, 0, 2]) + sub_all + rtp
                                       + bytes([12 << 3, 0, 0, 80]) + rtp)
    yield "room", b"\x00" + bytes([8 << 3 | 2, 0, 0, 0, 40]) + bytes([3 << 3 | 2, 0, 0]) + bytes([9 << 3 | 2, 0, 0, 1, 20])
    yield "raw", b"\x00" + bytes([0, 0, 0, 20]) + ctrl(1, rest=bytes(12))
    yield "stolen_cookie", (b"\x00" + reg + bytes([13 << 3 | 0x80 | 3, 0, 0, 0, 20]) + ctrl(2, rest=bytes(12))
                            + bytes([6 << 3 | 3, 0, 0]) + bytes([7 << 3, 0, 0]))


# ---------------------------------------------------------------- captures


def ipv4_udp(payload, sport=4000, dport=5000, src=b"\xc0\x00\x02\x01", dst=b"\xc0\x00\x02\x02"):
    udp = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, src, dst) + udp


def ipv4_tcp(seq, flags=0x18, payload=b"xx", opts=b""):
    doff = (20 + len(opts)) // 4
    tcp = struct.pack(">HHIIBBHHH", 5001, 80, seq, 1, doff << 4, flags, 65535, 0, 0) + opts + payload
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0,
                       b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02") + tcp


def ipv6_tcp(seq):
    tcp = struct.pack(">HHIIBBHHH", 5001, 80, seq, 1, 5 << 4, 0x10, 65535, 0, 0) + b"yy"
    return struct.pack(">IHBB16s16s", 0x60000000, len(tcp), 6, 64, b"\x20\x01\x0d\xb8" + bytes(11) + b"\x01",
                       b"\x20\x01\x0d\xb8" + bytes(11) + b"\x02") + tcp


def rtp_pkt(seq, ssrc=7):
    return struct.pack(">BBHII", 0x80, 96, seq, seq * 160, ssrc) + bytes(20)


def wrap(link, ip):
    if link == 1:
        return bytes(12) + (b"\x08\x00" if ip[0] >> 4 == 4 else b"\x86\xdd") + ip
    if link == 113:
        return bytes(14) + (b"\x08\x00" if ip[0] >> 4 == 4 else b"\x86\xdd") + ip
    if link == 276:
        return (b"\x08\x00" if ip[0] >> 4 == 4 else b"\x86\xdd") + bytes(18) + ip
    if link == 0:
        return struct.pack("<I", 2 if ip[0] >> 4 == 4 else 10) + ip
    if link == 239:
        return b"\x02\x00\x00\x00" + struct.pack("<HH", 4 + len(ip), 9) + ip
    return ip


def packets():
    p = [ipv4_udp(rtp_pkt(s)) for s in (1, 3, 2, 4)]
    p += [ipv4_tcp(s) for s in (1000, 1004, 1002)]
    p += [ipv4_tcp(2000, opts=b"\x01\x01\x05\x0a" + bytes(8))]
    p += [ipv6_tcp(s) for s in (5, 9, 7)]
    return p


def pcap_file(link, nano=False, be=False):
    e = ">" if be else "<"
    magic = 0xa1b23c4d if nano else 0xa1b2c3d4
    out = struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, 65535, link)
    for i, ip in enumerate(packets()):
        d = wrap(link, ip)
        out += struct.pack(e + "IIII", 1700000000, i * 1000, len(d), len(d)) + d
    return out


def pcapng_file(link, tsresol=9):
    shb = struct.pack("<IIIHHq", 0x0a0d0d0a, 28, 0x1a2b3c4d, 1, 0, -1) + struct.pack("<I", 28)
    opts = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HH", 0, 0)
    idb_body = struct.pack("<HHI", link, 0, 65535) + opts
    idb = struct.pack("<II", 1, 12 + len(idb_body)) + idb_body + struct.pack("<I", 12 + len(idb_body))
    out = shb + idb
    for i, ip in enumerate(packets()):
        d = wrap(link, ip)
        pad = (-len(d)) % 4
        ts = 1700000000 * 10**9 + i * 1000
        body = struct.pack("<IIIII", 0, ts >> 32, ts & 0xffffffff, len(d), len(d)) + d + bytes(pad)
        out += struct.pack("<II", 6, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))
    spb_body = struct.pack("<I", 20) + ipv4_udp(b"")
    out += struct.pack("<II", 3, 12 + len(spb_body)) + spb_body + struct.pack("<I", 12 + len(spb_body))
    return out


def nlmsg(ty, body, seq=0):
    pad = (-len(body)) % 4
    return struct.pack("=IHHII", 16 + len(body), ty, 0, seq, 0) + body + bytes(pad)


def nlattr(ty, data):
    pad = (-len(data)) % 4
    return struct.pack("=HH", 4 + len(data), ty) + data + bytes(pad)


def nfq_packet(pid, ip, cap=None):
    attrs = nlattr(1, struct.pack(">IHB", pid, 0x0800, 0)) + nlattr(10, ip)
    if cap is not None:
        attrs += nlattr(13, struct.pack(">I", cap))
    return nlmsg(3 << 8, b"\x02\x00\x00\x00" + attrs)


def nfqueue_seeds():
    yield "packets", b"".join(nfq_packet(i, ip) for i, ip in enumerate(packets()))
    yield "capped", nfq_packet(1, ipv4_tcp(7)[:40], cap=1500)
    yield "error_ack", nlmsg(2, struct.pack("=i", 0) + struct.pack("=IHHII", 0, 0, 0, 9, 0))
    yield "error_then_packet", nlmsg(2, struct.pack("=i", -1) + struct.pack("=IHHII", 0, 0, 0, 3, 0)) + nfq_packet(2, ipv6_tcp(1))
    yield "other", nlmsg(0x0301, b"\x02\x00\x00\x00")


def rtnetlink_seeds():
    # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
    v4 = struct.pack("=BBBBBBBBI", 2, 32, 0, 0, 254, 0, 0, 1, 0)
    v6 = struct.pack("=BBBBBBBBI", 10, 128, 0, 0, 254, 0, 0, 1, 0)
    routed = nlmsg(24, v4 + nlattr(1, bytes([10, 77, 3, 2])) + nlattr(4, struct.pack("=I", 2))
                   + nlattr(5, bytes([10, 77, 1, 2])), seq=1)
    onlink6 = nlmsg(24, v6 + nlattr(1, bytes.fromhex("fd770001000000000000000000000002"))
                    + nlattr(4, struct.pack("=I", 2)), seq=2)
    local = nlmsg(24, struct.pack("=BBBBBBBBI", 2, 32, 0, 0, 255, 0, 0, 2, 0)
                  + nlattr(4, struct.pack("=I", 1)), seq=3)
    # ndmsg: family, pad, pad, ifindex, state, flags, type
    neigh4 = nlmsg(28, struct.pack("=BBHiHBB", 2, 0, 0, 2, 0x02, 0, 1)
                   + nlattr(1, bytes([10, 77, 1, 2])) + nlattr(2, bytes([2, 0, 0, 0, 0, 1])), seq=4)
    neigh6 = nlmsg(28, struct.pack("=BBHiHBB", 10, 0, 0, 2, 0x04, 0, 1)
                   + nlattr(1, bytes.fromhex("fe800000000000000000000000000001"))
                   + nlattr(2, bytes([2, 0, 0, 0, 0, 2])), seq=4)
    incomplete = nlmsg(28, struct.pack("=BBHiHBB", 2, 0, 0, 2, 0x01, 0, 1)
                       + nlattr(1, bytes([10, 77, 1, 9])), seq=4)
    done = nlmsg(3, struct.pack("=i", 0), seq=4)
    error = nlmsg(2, struct.pack("=i", -101) + struct.pack("=IHHII", 36, 26, 1, 5, 0), seq=5)
    yield "route_v4_gateway", routed
    yield "route_v6_onlink", onlink6
    yield "route_local", local
    yield "routes_then_error", routed + onlink6 + error
    yield "neigh_dump", neigh4 + neigh6 + incomplete + done


# ---------------------------------------------------------------- XDP frames


def csum16(data):
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total > 0xffff:
        total = (total & 0xffff) + (total >> 16)
    return total


def udp_header(sport, dport, payload, pseudo, zero_checksum=False):
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    if zero_checksum:
        return udp
    c = 0xffff - csum16(pseudo + udp)
    return udp[:6] + struct.pack("!H", c or 0xffff) + udp[8:]


ETH_SRC, ETH_DST = bytes([2, 0, 0, 0, 0, 9]), bytes([2, 0, 0, 0, 0, 1])


def frame4(payload, options=b"", frag=0x4000, zero_checksum=False, proto=17):
    src, dst = bytes([10, 77, 0, 2]), bytes([10, 77, 0, 1])
    udp = udp_header(40000, 5004, payload,
                     src + dst + struct.pack("!BBH", 0, 17, 8 + len(payload)), zero_checksum)
    ihl = 5 + len(options) // 4
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, ihl * 4 + len(udp), 1, frag, 64, proto, 0,
                     src, dst) + options
    ip = ip[:10] + struct.pack("!H", 0xffff - csum16(ip)) + ip[12:]
    return ETH_DST + ETH_SRC + b"\x08\x00" + ip + udp


def frame6(payload, zero_checksum=False, next_header=17, body=None):
    src = bytes.fromhex("fd770000000000030000000000000002")
    dst = bytes.fromhex("fd770000000000000000000000000001")
    udp = udp_header(40000, 5004, payload,
                     src + dst + struct.pack("!I3xB", 8 + len(payload), 17), zero_checksum)
    body = udp if body is None else body
    ip = struct.pack("!IHBB", 0x60000000, len(body), next_header, 64) + src + dst
    return ETH_DST + ETH_SRC + b"\x86\xdd" + ip + body


def xdp_frame_seeds():
    rtp = bytes([0x80, 0x60, 0, 1, 0, 0, 0, 160, 0, 0, 0, 7]) + bytes(range(80))
    yield "v4_rtp", frame4(rtp)
    yield "v4_odd_payload", frame4(b"odd")
    yield "v4_no_checksum", frame4(rtp, zero_checksum=True)
    yield "v4_options", frame4(rtp, options=bytes([1, 1, 1, 0]))
    yield "v4_fragment", frame4(rtp, frag=0x2000)
    yield "v4_tcp", frame4(rtp, proto=6)
    yield "v4_padded", frame4(b"ab") + bytes(16)
    yield "v6_rtp", frame6(rtp)
    yield "v6_empty", frame6(b"")
    yield "v6_no_checksum", frame6(rtp, zero_checksum=True)
    bad = bytearray(frame6(rtp))
    bad[-1] ^= 1
    yield "v6_bad_checksum", bytes(bad)
    yield "v6_hop_by_hop", frame6(rtp, next_header=0,
                                  body=bytes([17, 0, 1, 4, 0, 0, 0, 0]) + frame6(rtp)[62 - 8:])
    yield "v6_ndp_solicit", frame6(b"", next_header=58, body=bytes([135, 0, 0, 0]) + bytes(20))
    yield "v6_truncated", frame6(rtp)[:70]
    yield "arp", ETH_DST + ETH_SRC + b"\x08\x06" + bytes(28)



# ---------------------------------------------------------------- Redis, HTTP, digest


def resp(v):
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, (bytes, str)):
        v = v.encode() if isinstance(v, str) else v
        return b"$%d\r\n%s\r\n" % (len(v), v)
    if v is None:
        return b"$-1\r\n"
    return b"*%d\r\n" % len(v) + b"".join(resp(x) for x in v)


# ---------------------------------------------------------------- DNS


def dns_name(name, pointer=None):
    out = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l)
    return out + (struct.pack(">H", 0xC000 | pointer) if pointer is not None else b"\0")


def dns_response(qid, rcode, qname, qtype, answers, authority=(), additional=()):
    """A response: sections are lists of (name, type, ttl, rdata)."""
    out = struct.pack(">HHHHHH", qid, 0x8180 | rcode, 1, len(answers), len(authority), len(additional))
    out += dns_name(qname) + struct.pack(">HH", qtype, 1)
    for section in (answers, authority, additional):
        for name, rtype, ttl, data in section:
            out += dns_name(name) + struct.pack(">HHIH", rtype, 1, ttl, len(data)) + data
    return out


def dns_srv(priority, weight, port, target):
    return struct.pack(">HHH", priority, weight, port) + dns_name(target)


def dns_naptr(order, pref, flags, services, replacement):
    cs = lambda s: bytes([len(s)]) + s.encode()
    return struct.pack(">HH", order, pref) + cs(flags) + cs(services) + cs("") + dns_name(replacement)


def dns_seeds():
    soa = dns_name("ns.test") + dns_name("admin.test") + struct.pack(">IIIII", 1, 2, 3, 4, 30)
    yield "naptr", dns_response(1, 0, "sip.test", 35, [
        ("sip.test", 35, 60, dns_naptr(10, 10, "S", "SIP+D2U", "_sip._udp.sip.test")),
        ("sip.test", 35, 60, dns_naptr(20, 10, "S", "SIP+D2T", "_sip._tcp.sip.test"))])
    yield "srv", dns_response(2, 0, "_sip._udp.sip.test", 33, [
        ("_sip._udp.sip.test", 33, 60, dns_srv(10, 60, 5070, "a.sip.test")),
        ("_sip._udp.sip.test", 33, 60, dns_srv(10, 40, 5071, "b.sip.test")),
        ("_sip._udp.sip.test", 33, 60, dns_srv(20, 0, 5080, "c.sip.test"))],
        additional=[("a.sip.test", 1, 60, bytes([10, 0, 0, 1]))])
    yield "a", dns_response(3, 0, "a.sip.test", 1, [("a.sip.test", 1, 60, bytes([10, 0, 0, 1]))])
    yield "aaaa", dns_response(4, 0, "a.sip.test", 28, [("a.sip.test", 28, 60, bytes(15) + b"\1")])
    yield "cname", dns_response(5, 0, "w.test", 1, [
        ("w.test", 5, 60, dns_name("a.sip.test")), ("a.sip.test", 1, 60, bytes([10, 0, 0, 2]))])
    yield "nxdomain_soa", dns_response(6, 3, "no.test", 1, [], authority=[("test", 6, 300, soa)])
    # Compression: the answer's owner points at the question name.
    compressed = bytearray(dns_response(7, 0, "p.test", 1, []))
    compressed[7] = 1
    compressed += struct.pack(">HHHIH", 0xC00C, 1, 1, 60, 4) + bytes([10, 0, 0, 3])
    yield "compressed", bytes(compressed)
    # A pointer loop and a count far beyond the datagram.
    looped = bytearray(compressed)
    looped[-16:-14] = struct.pack(">H", 0xC000 | (len(looped) - 16))
    yield "pointer_loop", bytes(looped)
    huge = bytearray(dns_response(8, 0, "h.test", 1, [("h.test", 1, 1, bytes(4))]))
    huge[6:8] = b"\xff\xff"
    yield "huge_count", bytes(huge)
    yield "many_records", dns_response(10, 0, "m.test", 1, [
        ("m.test", 1, 5, bytes([10, 0, i // 256, i % 256])) for i in range(100)])
    yield "srv_root_target", dns_response(9, 0, "_sip._udp.x.test", 33, [
        ("_sip._udp.x.test", 33, 60, dns_srv(0, 0, 0, ""))])


def redis_seeds():
    b1 = '{"i":"c1@x","s":2,"e":1700000060000,"u":5,"p":[]}'
    b2 = '{"i":"c2@x","s":1,"e":1700000090000,"u":7,"p":["<sip:192.0.2.10;lr>"]}'
    yield "two_bindings", resp([0, 1700000000000, "sip:alice@192.0.2.1", b1, "sip:alice@192.0.2.2", b2])
    yield "none", resp([0, 1700000000000])
    yield "out_of_order", resp([1, 1700000000000])
    yield "too_many", resp([2, 1700000000000])
    yield "expired", resp([0, 1700000100000, "sip:a@192.0.2.1", b1])
    yield "bad_json", resp([0, 1, "sip:a@192.0.2.1", "{"])
    yield "odd", resp([0, 1, "sip:a@192.0.2.1"])
    yield "error", b"-ERR unknown command\r\n"
    yield "status", b"+OK\r\n"
    yield "resp3_map", b"%1\r\n+a\r\n:1\r\n"
    yield "nil", resp(None)


def http_seeds():
    yield "metrics", b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n"
    yield "other", b"GET / HTTP/1.1\r\n\r\n"
    yield "post", b"POST /metrics HTTP/1.0\r\n\r\n"
    yield "bare_lf", b"GET /metrics\n\n"
    yield "binary", b"\xff\xfe GET /metrics\r\n\r\n"


def digest_seeds():
    yield "full", (b'Digest username="alice", realm="example.com", nonce="abc", uri="sip:bob@example.com", '
                   b'response="0123456789abcdef0123456789abcdef", algorithm=SHA-256, qop=auth, nc=00000001, '
                   b'cnonce="c0ffee", opaque="o"')
    yield "minimal", b'Digest username="a",realm="r",nonce="n",uri="u",response="ab"'
    yield "escaped", b'Digest username="a\\"b", realm="r", nonce="n", uri="u", response="ab"'
    yield "duplicate", b'Digest username="a", username="b", realm="r", nonce="n", uri="u", response="ab"'
    yield "basic", b"Basic YWxhZGRpbjpvcGVuc2VzYW1l"
    yield "token_values", b"digest USERNAME=a , realm=r,nonce=n,uri=u,response=AB,qop=auth,nc=0000000a,cnonce=x"


# ---------------------------------------------------------------- WebSocket


def ws_frame(opcode, payload, fin=True, mask=b"\x01\x02\x03\x04", masked=True):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    mbit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mbit | n])
    elif n <= 0xFFFF:
        head += bytes([mbit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([mbit | 127]) + struct.pack(">Q", n)
    if not masked:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_upgrade(protocol=b"sip", origin=b"https://a.test", version=b"13"):
    return (b"GET /sip HTTP/1.1\r\nHost: proxy.test\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: " + version + b"\r\nSec-WebSocket-Protocol: " + protocol +
            b"\r\nOrigin: " + origin + b"\r\n\r\n")


def ws_seeds():
    """`sip_ws` inputs: read size byte, policy byte, then the stream."""
    msg = req("OPTIONS")
    yield "ok-message", b"\x07\x00" + ws_upgrade() + ws_frame(1, msg)
    yield "ok-origin-listed", b"\x3f\x01" + ws_upgrade() + ws_frame(2, msg)
    yield "ok-fragments-ping", (b"\x03\x00" + ws_upgrade() + ws_frame(1, msg[:20], fin=False)
                                + ws_frame(9, b"hi") + ws_frame(0, msg[20:]) + ws_frame(8, b"\x03\xe8"))
    yield "ok-len16", b"\x10\x00" + ws_upgrade() + ws_frame(1, b"x" * 200)
    yield "bad-origin", b"\x3f\x01" + ws_upgrade(origin=b"https://evil.test") + ws_frame(1, msg)
    yield "bad-protocol", b"\x3f\x00" + ws_upgrade(protocol=b"chat")
    yield "bad-version", b"\x3f\x00" + ws_upgrade(version=b"8")
    yield "bad-unmasked", b"\x3f\x00" + ws_upgrade() + ws_frame(1, msg, masked=False)
    yield "bad-too-big", b"\x3f\x00" + ws_upgrade() + ws_frame(1, b"y" * 300)
    yield "bad-len64", b"\x3f\x00" + ws_upgrade() + b"\x81\xff" + struct.pack(">Q", 1 << 40)
    yield "bad-long-ping", b"\x3f\x00" + ws_upgrade() + ws_frame(9, b"p" * 126)
    yield "bad-continuation", b"\x3f\x00" + ws_upgrade() + ws_frame(0, b"x")


def ws_answer(accept=b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", protocol=b"sip", status=b"101 Switching Protocols",
              extra=b""):
    """A server's answer to the `sip_ws_client` target's upgrade (RFC 6455 1.3's key)."""
    return (b"HTTP/1.1 " + status + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: " + protocol +
            b"\r\n" + extra + b"\r\n")


def ws_client_seeds():
    """`sip_ws_client` inputs: read size byte, then the server's stream."""
    msg = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/WS 127.0.0.1:5066;branch=z9hG4bK1\r\nContent-Length: 0\r\n\r\n"
    plain = dict(masked=False)
    yield "ok-message", b"\x07" + ws_answer() + ws_frame(1, msg, **plain)
    yield "ok-fragments-ping", (b"\x03" + ws_answer() + ws_frame(1, msg[:20], fin=False, **plain)
                                + ws_frame(9, b"hi", **plain) + ws_frame(0, msg[20:], **plain)
                                + ws_frame(8, b"\x03\xe8", **plain))
    yield "ok-len16", b"\x10" + ws_answer() + ws_frame(2, b"x" * 200, **plain)
    yield "bad-accept", b"\x3f" + ws_answer(accept=b"s3pPLMBiTxaQ9kYGzzhZRbK+xOA=") + ws_frame(1, msg, **plain)
    yield "bad-protocol", b"\x3f" + ws_answer(protocol=b"chat")
    yield "bad-status", b"\x3f" + ws_answer(status=b"403 Forbidden")
    yield "bad-extension", b"\x3f" + ws_answer(extra=b"Sec-WebSocket-Extensions: permessage-deflate\r\n")
    yield "bad-masked", b"\x3f" + ws_answer() + ws_frame(1, msg)
    yield "bad-too-big", b"\x3f" + ws_answer() + ws_frame(1, b"y" * 300, **plain)
    yield "bad-len64", b"\x3f" + ws_answer() + b"\x81\x7f" + struct.pack(">Q", 1 << 40)


def main():
    for name, msg in MESSAGES.items():
        put("sip_parse", name, msg)
    for sub in ("rfc4475", "rfc5118"):
        d = os.path.join(TORTURE, sub)
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith((".tsv", ".txt")):
                    continue
                with open(os.path.join(d, f), "rb") as fh:
                    put("sip_parse", sub + "-" + f.replace(".dat", ""), fh.read())
    for name, data in proxy_scripts():
        put("sip_proxy", name, data)
    for name, data in dispatch_scripts():
        put("sip_dispatch", name, data)
    for name, data in digest_seeds():
        put("sip_digest", name, data)
    for name, data in sfu_wire_seeds():
        put("sfu_wire", name, data)
    for name, data in sfu_core_seeds():
        put("sfu_core", name, data)
    for link in (1, 113, 276, 0, 101, 239):
        put("pcap", "pcap-link%d" % link, pcap_file(link))
        put("pcap", "pcapng-link%d" % link, pcapng_file(link))
    put("pcap", "pcap-nano-be", pcap_file(1, nano=True, be=True))
    put("pcap", "pcapng-tsresol-pow2", pcapng_file(1, tsresol=0x8a))
    for name, data in nfqueue_seeds():
        put("nfqueue", name, data)
    for name, data in rtnetlink_seeds():
        put("rtnetlink", name, data)
    for name, data in xdp_frame_seeds():
        put("xdp_frame", name, data)
    for name, data in redis_seeds():
        put("redis_reply", name, data)
    for name, data in http_seeds():
        put("metrics_http", name, data)
    for name, data in dns_seeds():
        put("dns_response", name, data)
    for name, data in ws_seeds():
        put("sip_ws", name, data)
    for name, data in ws_client_seeds():
        put("sip_ws_client", name, data)
    # The SFU crate's own corpora: JackTrip datagrams (as scripts: each from
    # the three clients and from one that never shook hands) and join tokens.
    sfu = os.path.join(HERE, "..", "crates", "ringway-sfu", "tests", "corpus")
    for f in sorted(os.listdir(os.path.join(sfu, "jacktrip"))):
        with open(os.path.join(sfu, "jacktrip", f), "rb") as fh:
            d = fh.read()
        put("sfu_jacktrip", f, b"".join(bytes([p]) + struct.pack(">H", len(d)) + d for p in (0, 1, 2, 3, 0)))
    for f in sorted(os.listdir(os.path.join(sfu, "token"))):
        with open(os.path.join(sfu, "token", f), "rb") as fh:
            put("sfu_token", f, fh.read())
    # Recording files as `sfu serve --record-dir` writes them (and broken ones).
    for f in sorted(os.listdir(os.path.join(sfu, "recording"))):
        with open(os.path.join(sfu, "recording", f), "rb") as fh:
            put("sfu_recording", f, fh.read())


if __name__ == "__main__":
    main()
