//! A phone behind NAT, with real peers in network namespaces: baresip
//! (Debian package baresip-core) in a private network behind a router
//! namespace that masquerades (iptables MASQUERADE) registers with its
//! private Contact; SIPp in a third namespace calls it through the proxy.
//!
//!     phone 10.77.1.1 ── 10.77.1.2 router 10.77.2.1 ── 10.77.2.2 proxy 10.77.3.2 ── 10.77.3.1 caller
//!                                   (MASQUERADE)
//!
//! The proxy has no route to 10.77.1.0/24: the phone is reachable only
//! over the flow its REGISTER came in on (the router's mapping). With NAT
//! handling on (the default) the call is set up and torn down (INVITE over
//! the flow, ACK and BYE by the flow token in our Record-Route); with
//! `--nat off` the INVITE goes to the private Contact and the call fails.
//! Over TCP the REGISTER's connection is the flow.
//!
//! Every namespace (and with it each veth and the router's iptables rule)
//! is deleted when the topology drops, also while a failed assertion
//! unwinds; every process is killed by PID.

mod sip_proxy_support;

use ringway_io::netns::{Host, Topology};
use sip_proxy_support::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PHONE: &str = "10.77.1.1";
const PROXY: &str = "10.77.2.2";
const CALLER: &str = "10.77.3.1";

/// Run `program args` in `host`; panics with its output when it fails.
fn run_in(host: &Host, program: &str, args: &[&str]) {
    let out = host
        .command(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}",
        host.name,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// phone — router (MASQUERADE) — proxy — caller.
fn topology() -> Topology {
    let topo = Topology::builder()
        .host("phone")
        .host("router")
        .host("proxy")
        .host("caller")
        .link("phone", "router")
        .link("router", "proxy")
        .link("caller", "proxy")
        .build()
        .expect("build namespaces (needs root)");
    let host = |name: &str| topo.host(name).unwrap();
    // The phone's only way out is the router; the caller reaches the
    // proxy's address on the router side through the proxy.
    run_in(
        host("phone"),
        "ip",
        &["route", "add", "default", "via", "10.77.1.2"],
    );
    run_in(
        host("caller"),
        "ip",
        &["route", "add", "10.77.2.0/24", "via", "10.77.3.2"],
    );
    // Namespace-local settings: gone with the namespace.
    run_in(host("router"), "sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    run_in(
        host("router"),
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "10.77.1.0/24",
            "-o",
            "eth1",
            "-j",
            "MASQUERADE",
        ],
    );
    topo
}

/// baresip's configuration: no sound card (a sine source, the player
/// writes to /dev/null), auto answer, registering `alice` at the proxy.
fn write_baresip_config(dir: &Path, transport: &str) {
    let config = format!(
        "poll_method epoll\n\
         sip_listen {PHONE}:5060\n\
         audio_player aufile,/dev/null\n\
         audio_source ausine,440\n\
         audio_alert aufile,/dev/null\n\
         ausrc_srate 48000\n\
         auplay_srate 48000\n\
         ausrc_channels 2\n\
         auplay_channels 1\n\
         module_path /usr/lib/baresip/modules\n\
         module g711.so\n\
         module ausine.so\n\
         module aufile.so\n\
         module_tmp account.so\n\
         module_app menu.so\n"
    );
    std::fs::write(dir.join("config"), config).unwrap();
    let accounts = format!(
        "<sip:alice@{PROXY};transport={transport}>;auth_pass=unused;answermode=auto;regint=120\n"
    );
    std::fs::write(dir.join("accounts"), accounts).unwrap();
}

/// Start baresip in `phone` and wait until its registration is accepted.
fn start_phone(procs: &mut Procs, phone: &Host, dir: &Path) -> mpsc::Receiver<String> {
    let mut child = phone
        .command("baresip")
        .arg("-f")
        .arg(dir)
        .args(["-s", "-t", "90"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn baresip (Debian package baresip-core)");
    let stdout = child.stdout.take().unwrap();
    procs.add("baresip", child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let end = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let registered = line.contains("200 OK") && line.contains("binding");
                seen.push(line);
                if registered {
                    return rx;
                }
            }
            Err(_) => panic!("baresip did not register: {seen:#?}"),
        }
    }
}

/// One call from SIPp in `caller` to alice through the proxy; SIPp's
/// statistics.
fn call(caller: &Host, dir: &Path, transport: &str) -> SippStats {
    let csv = dir.join("uac.csv");
    let mut sipp = caller
        .command("sipp")
        .arg(format!("{PROXY}:5060"))
        .arg("-sf")
        .arg(scenarios().join("uac_rr.xml"))
        .args([
            "-s", "alice", "-key", "dest", PROXY, "-i", CALLER, "-p", "5061",
        ])
        .args(["-t", if transport == "tcp" { "t1" } else { "u1" }])
        .args(["-m", "1", "-d", "300"])
        // No answer within 6 s: the call failed (SIPp cancels it).
        .args(["-recv_timeout", "6000", "-timeout", "30", "-timeout_error"])
        .args(["-nostdin", "-trace_stat", "-fd", "1", "-stf"])
        .arg(&csv)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sipp (Debian package sip-tester)");
    wait_bounded(&mut sipp, Duration::from_secs(45));
    let text = std::fs::read_to_string(&csv).unwrap_or_default();
    parse_sipp_csv(&text).unwrap_or_else(|| panic!("no SIPp statistics in {}", csv.display()))
}

/// Register alice from behind the NAT over `transport` (`udp`, `tcp`),
/// call her with `proxy_args` added; SIPp's statistics, the proxy's
/// summary and what baresip printed.
fn call_behind_nat(
    transport: &'static str,
    proxy_args: &'static [&'static str],
) -> (SippStats, serde_json::Value, Vec<String>) {
    if Command::new("baresip").arg("-h").output().is_err() {
        panic!("baresip is not installed (Debian package baresip-core, scripts/install-deps.sh)");
    }
    let topo = topology();
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Procs::default();
    let proxy_host = topo.host("proxy").unwrap().clone();
    let proxy_dir = dir.path().to_path_buf();
    // The proxy runs as this binary's child inside the proxy namespace:
    // start_proxy spawns it from a thread that entered the namespace.
    let (proxy, proxy_procs) = proxy_host
        .run(move || {
            let mut procs = Procs::default();
            let mut args = vec![
                "--listen",
                "10.77.2.2:5060",
                "--listen",
                "tcp:10.77.2.2:5060",
                "--registrar",
                "--mode",
                "stateful",
            ];
            args.extend_from_slice(proxy_args);
            let p = start_proxy(&mut procs, &proxy_dir, &args);
            (p, procs)
        })
        .expect("enter the proxy namespace");
    let mut proxy_procs = proxy_procs;
    let phone_dir = dir.path().join("baresip");
    std::fs::create_dir_all(&phone_dir).unwrap();
    write_baresip_config(&phone_dir, transport);
    let phone_out = start_phone(&mut procs, topo.host("phone").unwrap(), &phone_dir);
    let stats = call(topo.host("caller").unwrap(), dir.path(), transport);
    let summary = stop_proxy(&mut proxy_procs, &proxy);
    drop(procs);
    let printed: Vec<String> = phone_out.try_iter().collect();
    eprintln!("sipp: {stats:?}");
    (stats, summary, printed)
}

#[test]
fn a_phone_behind_nat_is_called_over_its_udp_flow() {
    let (stats, summary, printed) = call_behind_nat("udp", &[]);
    assert_eq!(stats.successful, 1, "{stats:?}\n{printed:#?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    // The INVITE reached the phone, from the proxy, through the router.
    assert!(
        printed
            .iter()
            .any(|l| l.contains(&format!("UDP {PROXY}:5060 -> {PHONE}:5060"))),
        "{printed:#?}"
    );
    assert!(summary["proxy"]["requests_forwarded"].as_u64().unwrap() >= 3);
}

#[test]
fn without_nat_handling_the_phone_behind_nat_is_not_reachable() {
    let (stats, _, printed) = call_behind_nat("udp", &["--nat", "off"]);
    assert_eq!(stats.successful, 0, "{stats:?}");
    assert_eq!(stats.failed, 1, "{stats:?}");
    // Nothing from the proxy reached the phone after its registration.
    assert!(
        !printed.iter().any(|l| l.starts_with("INVITE ")),
        "{printed:#?}"
    );
}

#[test]
fn a_phone_behind_nat_is_called_over_its_tcp_connection() {
    let (stats, summary, printed) = call_behind_nat("tcp", &[]);
    assert_eq!(stats.successful, 1, "{stats:?}\n{printed:#?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    // The phone opened one connection; the proxy opened none towards it
    // (it could not: the phone's address is private).
    assert_eq!(
        summary["tcp"]["accepted"].as_u64(),
        Some(2),
        "{}",
        summary["tcp"]
    );
    assert_eq!(
        summary["tcp"]["connected"].as_u64(),
        Some(0),
        "{}",
        summary["tcp"]
    );
}
