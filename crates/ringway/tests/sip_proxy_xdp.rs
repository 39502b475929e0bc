//! The SIP proxy on the AF_XDP backend (`--backend xdp --interface`) in a
//! veth testbed: SIPp UAC, proxy and SIPp UAS each in a namespace of their
//! own on one bridge; calls in both modes (stateful with receive
//! coalescing) with every datagram through the XSK rings, over IPv4 and
//! over IPv6 (unique local addresses); ping and
//! UDP to another port of the proxy's address still answered by its kernel
//! (XDP_PASS); and the fallback to mmsg with the reason when XDP cannot
//! start or the interface has several receive queues.

mod sip_proxy_support;

use ringway_io::netns::{Host, Topology};
use sip_proxy_support::*;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const CALLS: u32 = 40;

/// The kernel runs AF_XDP (socket, UMEM, program load); else skip, saying why.
fn xdp_here() -> bool {
    match ringway_io::BackendKind::Xdp.availability() {
        Ok(()) => true,
        Err(why) => {
            ringway_io::testing::skip(format!("the kernel refuses AF_XDP: {why}"));
            false
        }
    }
}

/// UAC, proxy and UAS on one bridge (10.77.0.1, .2, .3; with `ipv6` also
/// fd77::1, ::2, ::3, which the tests then use), with full UDP checksums
/// from the SIPp hosts (a same-host veth sender leaves them partial; the
/// backend verifies every checksum it receives).
fn testbed(ipv6: bool) -> (Topology, Host, Host, Host) {
    let builder = Topology::builder()
        .host("uac")
        .host("proxy")
        .host("uas")
        .bridge();
    let builder = if ipv6 { builder.ipv6() } else { builder };
    let topo = builder
        .build()
        .expect("build the veth testbed (needs root)");
    let host = |name: &str| topo.host(name).expect("built").clone();
    let (uac, proxy, uas) = (host("uac"), host("proxy"), host("uas"));
    for h in [&uac, &uas] {
        h.run(|| ringway_io::backend::disable_tx_checksum_offload("eth0"))
            .expect("enter namespace")
            .expect("turn transmit checksum offload off");
    }
    (topo, uac, proxy, uas)
}

/// Run `f` with `procs` on a thread inside `host` (children it starts live
/// in that namespace).
fn inside<T: Send + 'static>(
    host: &Host,
    procs: Procs,
    f: impl FnOnce(&mut Procs) -> T + Send + 'static,
) -> (Procs, T) {
    host.run(move || {
        let mut procs = procs;
        let out = f(&mut procs);
        (procs, out)
    })
    .expect("enter namespace")
}

/// `host`'s address (IPv6 in an IPv6 testbed) with `port`.
fn addr(host: &Host, port: u16) -> SocketAddr {
    match host.addr6() {
        Some(v6) => SocketAddr::from((v6, port)),
        None => SocketAddr::from((host.addr(), port)),
    }
}

/// Start the proxy on the proxy host's veth with `extra` arguments.
fn start_xdp_proxy(
    procs: Procs,
    dir: PathBuf,
    proxy: &Host,
    extra: &'static [&'static str],
) -> (Procs, ProxyProc) {
    let listen = addr(proxy, 5060);
    let relay = if listen.is_ipv6() {
        "fd77::/48"
    } else {
        "10.77.0.0/16"
    };
    let listen = listen.to_string();
    inside(proxy, procs, move |procs| {
        let mut args = vec!["--listen", &listen, "--relay", relay];
        args.extend_from_slice(extra);
        start_proxy(procs, &dir, &args)
    })
}

/// `CALLS` calls from the UAC host through the proxy to the UAS host.
fn calls(
    procs: Procs,
    dir: PathBuf,
    (uac, proxy, uas): (&Host, &Host, &Host),
    name: &'static str,
) -> (Procs, SippStats) {
    let args = uac_args(
        addr(proxy, 5060),
        addr(uac, 5061),
        "bob",
        &addr(uas, 5070).to_string(),
        CALLS,
        40,
    );
    let (procs, (st, stats)) = inside(uac, procs, move |procs| {
        run_sipp(procs, &dir, name, &args, Duration::from_secs(60))
    });
    eprintln!("sipp {name}: {stats:?} exit {st:?}");
    assert!(
        st.is_some_and(|s| s.success()),
        "SIPp UAC failed: {stats:?}"
    );
    (procs, stats)
}

/// Every SIP datagram took the XSK rings: none came through the kernel
/// socket, and at most the first to each peer left through it (before
/// the kernel had resolved the peer's MAC address).
fn check_xdp_path(s: &serde_json::Value, sipp: &SippStats) {
    assert_eq!(sipp.failed, 0, "{sipp:?}");
    assert_eq!(sipp.successful, CALLS as u64, "{sipp:?}");
    assert_eq!(s["config"]["backend"], "xdp", "{}", s["config"]);
    assert_eq!(s["config"]["backend_fallback"], serde_json::Value::Null);
    assert!(
        s["config"]["io_mode"]
            .as_str()
            .unwrap()
            .contains("native XDP"),
        "{}",
        s["config"]
    );
    let io = &s["io"];
    let messages_in = s["messages"]["in"].as_u64().unwrap();
    assert!(messages_in >= 5 * CALLS as u64, "{}", s["messages"]);
    assert_eq!(io["rx_via_socket"], 0, "{io}");
    assert_eq!(io["rx_packets"].as_u64().unwrap(), messages_in, "{io}");
    assert_eq!(io["rx_bad_checksum"], 0, "{io}");
    assert_eq!(io["rx_invalid"], 0, "{io}");
    let tx = io["tx_packets"].as_u64().unwrap();
    assert!(tx >= 5 * CALLS as u64, "{io}");
    assert!(io["tx_via_socket"].as_u64().unwrap() <= 4, "{io}");
    assert_eq!(io["tx_errors"], 0, "{io}");
    assert_eq!(s["drops"]["core_dropped"], 0, "{}", s["drops"]);
}

/// A UDP echo on another port of the proxy host, served by the kernel.
fn udp_echo_on(proxy: &Host, port: u16) -> std::thread::JoinHandle<std::io::Result<()>> {
    let bind = addr(proxy, port);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = proxy.spawn(move || {
        let socket = UdpSocket::bind(bind).expect("bind the echo socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 512];
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok((n, from)) = socket.recv_from(&mut buf) {
                socket.send_to(&buf[..n], from).unwrap();
                if &buf[..n] == b"last" {
                    break;
                }
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("echo socket bound");
    handle
}

/// From the UAC host: ping the proxy's address and a datagram to the echo
/// port; both answered by the proxy host's kernel past the XDP program.
fn kernel_still_answers(uac: &Host, proxy: &Host, echo_port: u16) {
    let out = uac
        .command("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2"])
        .arg(addr(proxy, 0).ip().to_string())
        .output()
        .expect("run ping (iputils-ping)");
    assert!(
        out.status.success(),
        "ping to the proxy's address failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let target = addr(proxy, echo_port);
    let echoed = uac
        .run(move || -> std::io::Result<bool> {
            let any: std::net::IpAddr = if target.is_ipv6() {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            };
            let socket = UdpSocket::bind((any, 0))?;
            socket.set_read_timeout(Some(Duration::from_millis(300)))?;
            let mut buf = [0u8; 64];
            for _ in 0..20 {
                socket.send_to(b"hello", target)?;
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    if from == target && &buf[..n] == b"hello" {
                        socket.send_to(b"last", target)?;
                        return Ok(true);
                    }
                }
            }
            Ok(false)
        })
        .expect("enter namespace")
        .expect("UDP on the UAC host");
    assert!(
        echoed,
        "UDP to another port of the proxy's address got no echo"
    );
}

#[test]
fn sipp_calls_through_the_proxy_on_af_xdp_in_both_modes() {
    if !xdp_here() {
        return;
    }
    let (_topo, uac, proxy, uas) = testbed(false);
    calls_in_both_modes(&uac, &proxy, &uas);
}

/// The same on `ringway lab sip --netns`'s testbed: SIPp UAC and UAS in
/// the generator's host, the proxy across the veth pair, whose generator
/// end runs the lab's pass-everything XDP program with threaded NAPI.
#[test]
fn sipp_calls_through_the_proxy_on_af_xdp_on_the_lab_testbed_in_both_modes() {
    if !xdp_here() {
        return;
    }
    let bed = ringway_lab::siplab::veth::SipTestbed::build(false)
        .expect("build the lab's veth testbed (needs root)");
    let (gen, proxy) = (bed.gen().clone(), bed.proxy().clone());
    assert_eq!(addr(&proxy, 5060), bed.proxy_addr());
    calls_in_both_modes(&gen, &proxy, &gen);
}

/// SIPp calls from `uac` through the proxy on AF_XDP in `proxy` to `uas`,
/// stateless then stateful, every datagram through the XSK rings, and
/// the proxy host's kernel still answering what is not SIP for it.
fn calls_in_both_modes(uac: &Host, proxy: &Host, uas: &Host) {
    let (uac, proxy, uas) = (uac.clone(), proxy.clone(), uas.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Procs::default();
    let uas_addr = addr(&uas, 5070);
    let d = dir.path().to_path_buf();
    (procs, _) = inside(&uas, procs, move |procs| {
        spawn_sipp(procs, &d, &uas_args(uas_addr))
    });
    for (mode, name) in [("stateless", "uac-stateless"), ("stateful", "uac-stateful")] {
        let extra: &'static [&'static str] = match mode {
            "stateless" => &[
                "--mode",
                "stateless",
                "--backend",
                "xdp",
                "--interface",
                "eth0",
            ],
            // With receive coalescing (1 ms windows): the same calls.
            _ => &[
                "--mode",
                "stateful",
                "--backend",
                "xdp",
                "--interface",
                "eth0",
                "--rx-coalesce-us",
                "1000",
            ],
        };
        let (p, proxy_proc) = start_xdp_proxy(procs, dir.path().to_path_buf(), &proxy, extra);
        procs = p;
        let echo = udp_echo_on(&proxy, 9999);
        let (p, stats) = calls(procs, dir.path().to_path_buf(), (&uac, &proxy, &uas), name);
        procs = p;
        kernel_still_answers(&uac, &proxy, 9999);
        echo.join().unwrap().unwrap();
        let summary = stop_proxy(&mut procs, &proxy_proc);
        eprintln!("{mode}: io {}", summary["io"]);
        check_xdp_path(&summary, &stats);
        assert_eq!(summary["config"]["mode"], mode);
        assert_eq!(summary["config"]["interface"], "eth0");
        let messages = &summary["messages"];
        let wakeups = messages["wakeups"].as_u64().unwrap();
        assert!(
            wakeups > 0 && wakeups <= messages["in"].as_u64().unwrap(),
            "{messages}"
        );
        if mode == "stateful" {
            // 240 datagrams/s leave most 1 ms windows empty: none is
            // slept, so coalescing costs no wake-up (checked above: no
            // more wake-ups than datagrams; a window after every quick
            // 180/200 pair made 261 for 240).
            assert_eq!(summary["config"]["rx_coalesce_us"], 1000);
        } else {
            assert_eq!(messages["rx_coalesce_windows"], 0, "{messages}");
        }
    }
}

/// Over IPv6: SIPp calls through the stateless proxy on AF_XDP, every
/// datagram through the XSK rings as IPv6 frames (the peers' MACs from
/// the kernel's NDP entries); ping and UDP to another port still reach the
/// proxy host's kernel (ICMPv6 and neighbour discovery pass the program).
#[test]
fn sipp_calls_through_the_proxy_on_af_xdp_over_ipv6() {
    if !xdp_here() {
        return;
    }
    let (_topo, uac, proxy, uas) = testbed(true);
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Procs::default();
    let uas_addr = addr(&uas, 5070);
    assert!(uas_addr.is_ipv6());
    let d = dir.path().to_path_buf();
    (procs, _) = inside(&uas, procs, move |procs| {
        spawn_sipp(procs, &d, &uas_args(uas_addr))
    });
    let extra: &'static [&'static str] = &[
        "--mode",
        "stateless",
        "--backend",
        "xdp",
        "--interface",
        "eth0",
    ];
    let (p, proxy_proc) = start_xdp_proxy(procs, dir.path().to_path_buf(), &proxy, extra);
    procs = p;
    let echo = udp_echo_on(&proxy, 9999);
    let (p, stats) = calls(
        procs,
        dir.path().to_path_buf(),
        (&uac, &proxy, &uas),
        "uac-v6",
    );
    procs = p;
    kernel_still_answers(&uac, &proxy, 9999);
    echo.join().unwrap().unwrap();
    let summary = stop_proxy(&mut procs, &proxy_proc);
    eprintln!("ipv6: io {}", summary["io"]);
    check_xdp_path(&summary, &stats);
}

/// An interface that does not exist: the proxy falls back to mmsg, says
/// why on stderr and in the summary, and carries calls.
#[test]
fn xdp_that_cannot_start_falls_back_to_mmsg_with_the_reason() {
    let (_topo, uac, proxy, uas) = testbed(false);
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Procs::default();
    let uas_addr = addr(&uas, 5070);
    let d = dir.path().to_path_buf();
    (procs, _) = inside(&uas, procs, move |procs| {
        spawn_sipp(procs, &d, &uas_args(uas_addr))
    });
    let (p, proxy_proc) = start_xdp_proxy(
        procs,
        dir.path().to_path_buf(),
        &proxy,
        &["--backend", "xdp", "--interface", "nosuch0"],
    );
    procs = p;
    let startup = proxy_proc.startup.join("\n");
    assert!(
        startup.contains("falling back to mmsg") && startup.contains("nosuch0"),
        "{startup}"
    );
    let (mut procs, stats) = calls(procs, dir.path().to_path_buf(), (&uac, &proxy, &uas), "uac");
    let summary = stop_proxy(&mut procs, &proxy_proc);
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(
        summary["config"]["backend"], "mmsg",
        "{}",
        summary["config"]
    );
    let why = summary["config"]["backend_fallback"].as_str().unwrap();
    assert!(why.contains("nosuch0"), "{why}");
    assert_eq!(summary["config"]["interface"], "nosuch0");
    assert!(summary["io"]["rx_packets"].as_u64().unwrap() >= 5 * CALLS as u64);
}

/// An interface with two receive queues: the one worker's socket on queue
/// 0 would miss what the NIC hashes to queue 1, so the proxy refuses xdp
/// there, says why, and runs on mmsg.
#[test]
fn xdp_on_a_multi_queue_interface_falls_back_with_the_reason() {
    let (_topo, _uac, proxy, _uas) = testbed(false);
    // A second veth pair inside the proxy's host, two queues each end
    // (gone with the namespace).
    let out = proxy
        .command("ip")
        .args(["link", "add", "mq0", "numrxqueues", "2", "numtxqueues", "2"])
        .args(["type", "veth", "peer", "name", "mq1"])
        .args(["numrxqueues", "2", "numtxqueues", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let dir = tempfile::tempdir().unwrap();
    let (mut procs, proxy_proc) = start_xdp_proxy(
        Procs::default(),
        dir.path().to_path_buf(),
        &proxy,
        &["--backend", "xdp", "--interface", "mq0"],
    );
    let startup = proxy_proc.startup.join("\n");
    assert!(
        startup.contains("falling back to mmsg") && startup.contains("2 receive queues"),
        "{startup}"
    );
    let summary = stop_proxy(&mut procs, &proxy_proc);
    assert_eq!(summary["config"]["backend"], "mmsg");
    let why = summary["config"]["backend_fallback"].as_str().unwrap();
    assert!(why.contains("mq0 has 2 receive queues"), "{why}");
}

/// `--backend xdp` without `--interface` and `--interface` without xdp are
/// refused before anything starts.
#[test]
fn xdp_options_go_together() {
    for (args, want) in [
        (
            &["--backend", "xdp"][..],
            "--backend xdp needs an interface",
        ),
        (
            &["--interface", "eth0"][..],
            "--interface needs --backend xdp",
        ),
    ] {
        let out = Command::new(ringway())
            .args(["sip", "proxy", "--duration", "1"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
}
