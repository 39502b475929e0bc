//! IPv6 end to end, every address IPv6, SIPp UAC → proxy → SIPp UAS:
//!
//! - on `[::1]` in a private network namespace, over UDP, TCP and TLS
//!   (SIPp behind stunnel: Debian's SIPp has no TLS);
//! - on a ULA between two namespaces (the UAs in one, the proxy in the
//!   other, a veth pair between them, `fd77:0:0:1::/64`), over UDP, TCP
//!   and TLS, in both proxy modes.
//!
//! The calls complete only if our Via and Record-Route carry the
//! bracketed address (SIPp's UAS answers by the Via, its ACK and BYE
//! follow the Record-Route), the relay policy lets the IPv6 network
//! through, the flood limiter (per /64) counts IPv6 sources without
//! refusing them, and over TLS the certificates are verified for IPv6
//! addresses (subjectAltName iPAddress) both ways: stunnel checks the
//! proxy's, the proxy checks the UAS side's when it connects to it.

mod sip_proxy_support;

use ringway_io::netns::{Host, Topology};
use sip_proxy_support::*;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const CALLS: u32 = 10;

/// Wait until a UDP socket is bound to `port` in this namespace (bounded).
fn wait_udp_bound(port: u16) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new("ss")
            .args(["-Huln", &format!("sport = :{port}")])
            .output()
            .expect("ss (Debian package iproute2)");
        if !out.stdout.is_empty() {
            return;
        }
        assert!(Instant::now() < end, "nothing bound to UDP port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `CALLS` calls over `transport` (`u1` or `t1`) from SIPp on
/// `ua`:`uac_port` through the proxy at `proxy` to SIPp's UAS on
/// `ua`:`uas_port` (stopped afterwards).
fn sipp_calls(
    procs: &mut Procs,
    dir: &Path,
    proxy: SocketAddr,
    ua: IpAddr,
    transport: &str,
    (uac_port, uas_port): (u16, u16),
) -> SippStats {
    let uas_at = SocketAddr::new(ua, uas_port);
    let mut uas = uas_args(uas_at);
    uas.extend(["-t".to_string(), transport.to_string()]);
    let uas_pid = spawn_sipp(procs, dir, &uas);
    let dest = match transport {
        "t1" => {
            wait_listening(&uas_at.to_string());
            format!("{uas_at};transport=tcp")
        }
        _ => {
            wait_udp_bound(uas_port);
            uas_at.to_string()
        }
    };
    let mut uac = uac_args(
        proxy,
        SocketAddr::new(ua, uac_port),
        "bob",
        &dest,
        CALLS,
        20,
    );
    uac.extend(["-t".to_string(), transport.to_string()]);
    let name = format!("uac-{transport}-{uac_port}");
    let (st, stats) = run_sipp(procs, dir, &name, &uac, Duration::from_secs(60));
    eprintln!("sipp {transport} via {proxy}: {stats:?} exit {st:?}");
    if let Some(mut uas) = procs.take(uas_pid) {
        let _ = uas.kill();
        let _ = uas.wait();
    }
    stats
}

/// The proxy's arguments: UDP, TCP (same port) and TLS (port + 1) on
/// `ip`, relaying to `relay`, in `mode`, with the certificates of `dir`.
fn proxy_args(ip: IpAddr, relay: &str, mode: &str, dir: &Path) -> Vec<String> {
    let udp = SocketAddr::new(ip, 5060);
    let tls = SocketAddr::new(ip, 5061);
    let file = |name: &str| dir.join(name).display().to_string();
    strings(&[
        "--listen",
        &udp.to_string(),
        "--listen",
        &format!("tcp:{udp}"),
        "--listen",
        &format!("tls:{tls}"),
        "--relay",
        relay,
        "--mode",
        mode,
        "--flood-limit",
        "100000",
        "--tls-cert",
        &file("proxy.pem"),
        "--tls-key",
        &file("proxy.key"),
        "--tls-ca",
        &file("ca.pem"),
    ])
}

/// A test CA, the proxy's certificate and the UAS side's (`peer`), each
/// for the IPv6 addresses given (and 127.0.0.1).
fn make_certs(dir: &Path, proxy_ips: &[&str], peer_ips: &[&str]) {
    make_ca(dir);
    let proxy: Vec<&str> = [&["127.0.0.1"], proxy_ips].concat();
    let peer: Vec<&str> = [&["127.0.0.1"], peer_ips].concat();
    make_cert_for(dir, "proxy", "proxy", &proxy, &[]);
    make_cert_for(dir, "peer", "peer", &peer, &[]);
}

/// What one proxy carried over UDP, TCP and TLS.
struct Run {
    summary: serde_json::Value,
    udp: SippStats,
    tcp: SippStats,
    tls: SippStats,
}

fn check(run: &Run) {
    for (name, stats) in [("udp", &run.udp), ("tcp", &run.tcp), ("tls", &run.tls)] {
        assert_eq!(stats.failed, 0, "{name}: {stats:?}");
        assert_eq!(stats.successful, CALLS as u64, "{name}: {stats:?}");
    }
    let s = &run.summary;
    assert!(
        s["proxy"]["requests_forwarded"].as_u64().unwrap() >= 3 * 3 * CALLS as u64,
        "{}",
        s["proxy"]
    );
    let tcp = &s["tcp"];
    // Accepted: the TCP UAC's and the UAC stunnel's; opened: to the TCP
    // UAS and to the UAS stunnel (over TLS, the proxy verifying its
    // certificate for the IPv6 address).
    assert!(tcp["accepted"].as_u64().unwrap() >= 2, "{tcp}");
    assert!(tcp["connected"].as_u64().unwrap() >= 2, "{tcp}");
    assert_eq!(tcp["no_connection"], 0, "{tcp}");
    assert!(tls_counter(s, "handshakes") >= 2, "{}", s["tls"]);
    assert_eq!(tls_counter(s, "handshake_failures"), 0, "{}", s["tls"]);
}

/// UDP, TCP and TLS calls through one proxy at `proxy_ip`, the UAs at
/// `ua` (in the calling thread's namespace each step's closure runs in).
fn three_transports(
    procs: &mut Procs,
    dir: &Path,
    (proxy_ip, ua): (IpAddr, IpAddr),
    on_ua: &dyn Fn(&mut (dyn FnMut() + Send)),
) -> (SippStats, SippStats, SippStats) {
    let proxy = SocketAddr::new(proxy_ip, 5060);
    let mut out = None;
    on_ua(&mut || {
        let udp = sipp_calls(procs, dir, proxy, ua, "u1", (5061, 5070));
        let tcp = sipp_calls(procs, dir, proxy, ua, "t1", (5063, 5072));
        let (_, tls) = StunnelCalls {
            ua,
            proxy: SocketAddr::new(proxy_ip, 5061),
            mutual: false,
            calls: CALLS,
        }
        .run(procs, dir);
        out = Some((udp, tcp, tls));
    });
    out.expect("the calls ran")
}

#[test]
fn sipp_calls_over_udp_tcp_and_tls_on_ipv6_loopback() {
    let run = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        make_certs(d, &["::1"], &["::1"]);
        let mut procs = Procs::default();
        let loopback: IpAddr = "::1".parse().unwrap();
        let args = proxy_args(loopback, "::1/128", "stateful", d);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = start_proxy(&mut procs, d, &args);
        let (udp, tcp, tls) = three_transports(
            &mut procs,
            d,
            (loopback, loopback),
            &|f: &mut (dyn FnMut() + Send)| f(),
        );
        Run {
            summary: stop_proxy(&mut procs, &p),
            udp,
            tcp,
            tls,
        }
    });
    check(&run);
}

/// The UAs' and the proxy's addresses on the ULA link (what
/// `Topology::ipv6` gives the two ends of the first link).
const UA_ULA: &str = "fd77:0:0:1::1";
const PROXY_ULA: &str = "fd77:0:0:1::2";

/// Run `f` on a thread inside `host`'s namespace (what it starts stays there).
fn within<T: Send>(host: &Host, f: impl FnOnce() -> T + Send) -> T {
    host.run(f).expect("enter the namespace")
}

/// UDP, TCP and TLS calls between a UA namespace and a proxy namespace
/// over their ULA link, the proxy in `mode` relaying to the /64.
fn calls_over_ula(mode: &str) -> Run {
    // Dropped last: every process is killed before the namespaces go.
    let topo = Topology::builder()
        .host("ua")
        .host("proxy")
        .link("ua", "proxy")
        .ipv6()
        .build()
        .expect("build namespaces (needs root)");
    let (ua_host, proxy_host) = (topo.host("ua").unwrap(), topo.host("proxy").unwrap());
    assert_eq!(ua_host.addr6(), UA_ULA.parse().ok());
    assert_eq!(proxy_host.addr6(), PROXY_ULA.parse().ok());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d, &[PROXY_ULA], &[UA_ULA]);
    let mut procs = Procs::default();
    let (proxy_ip, ua): (IpAddr, IpAddr) = (PROXY_ULA.parse().unwrap(), UA_ULA.parse().unwrap());
    let args = proxy_args(proxy_ip, "fd77:0:0:1::/64", mode, d);
    let p = within(proxy_host, || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_proxy(&mut procs, d, &args)
    });
    let (udp, tcp, tls) = three_transports(
        &mut procs,
        d,
        (proxy_ip, ua),
        &|f: &mut (dyn FnMut() + Send)| within(ua_host, f),
    );
    let summary = stop_proxy(&mut procs, &p);
    drop(procs);
    drop(topo);
    Run {
        summary,
        udp,
        tcp,
        tls,
    }
}

#[test]
fn sipp_calls_over_a_ula_between_namespaces_stateless() {
    check(&calls_over_ula("stateless"));
}

#[test]
fn sipp_calls_over_a_ula_between_namespaces_stateful() {
    check(&calls_over_ula("stateful"));
}
