//! TLS test beds: a test CA and certificates made by the openssl CLI,
//! stunnel in front of SIPp (Debian's SIPp has no TLS), and the TLS
//! counters of the proxy's summary.

use super::{run_sipp, scenarios, spawn_sipp, uac_args, uas_args, Procs, SippStats};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA (`ca.pem`, `ca.key`) in `dir`.
pub(crate) fn make_ca(dir: &Path) {
    run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=ringway-test-ca", "-keyout", "ca.key", "-out"])
        .args(["ca.pem", "-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign"])
        .current_dir(dir));
}

/// A certificate `NAME.pem` / `NAME.key` signed by the test CA, for
/// 127.0.0.1 and the DNS names given, with common name `cn`.
pub(crate) fn make_cert(dir: &Path, name: &str, cn: &str, dns: &[&str]) -> (PathBuf, PathBuf) {
    make_cert_for(dir, name, cn, &["127.0.0.1"], dns)
}

/// A certificate `NAME.pem` / `NAME.key` signed by the test CA, for the
/// IP addresses (IPv4 or IPv6, as subjectAltName iPAddress entries) and
/// DNS names given, with common name `cn`.
pub(crate) fn make_cert_for(
    dir: &Path,
    name: &str,
    cn: &str,
    ips: &[&str],
    dns: &[&str],
) -> (PathBuf, PathBuf) {
    let san: Vec<String> = ips
        .iter()
        .map(|ip| format!("IP:{ip}"))
        .chain(dns.iter().map(|d| format!("DNS:{d}")))
        .collect();
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!(
            "subjectAltName={}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n",
            san.join(",")
        ),
    )
    .unwrap();
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", &format!("/CN={cn}")])
        .args(["-keyout", &format!("{name}.key.new")])
        .args(["-out", &format!("{name}.csr")])
        .current_dir(dir));
    run(Command::new("openssl")
        .args(["x509", "-req", "-in", &format!("{name}.csr")])
        .args([
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
        ])
        .args(["-extfile", &format!("{name}.ext")])
        .args(["-out", &format!("{name}.pem.new")])
        .current_dir(dir));
    // Renamed into place (a reload never sees half a file).
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::rename(dir.join(format!("{name}.key.new")), &key).unwrap();
    std::fs::rename(dir.join(format!("{name}.pem.new")), &cert).unwrap();
    (cert, key)
}

/// A CA (`ca.pem`, `ca.key`) and a proxy certificate for 127.0.0.1
/// (`proxy.pem`, `proxy.key`) in `dir`.
pub(crate) fn make_proxy_certs(dir: &Path) {
    make_ca(dir);
    make_cert(dir, "proxy", "proxy", &[]);
}

/// Wait until something listens on `addr` (bounded).
pub(crate) fn wait_listening(addr: &str) {
    let end = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// stunnel with this configuration body (foreground, no pid file), in
/// the network namespace of the calling thread.
pub(crate) fn spawn_stunnel(procs: &mut Procs, dir: &Path, name: &str, body: &str) {
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!("foreground = yes\npid =\ndebug = 4\noutput = {name}.log\n{body}"),
    )
    .unwrap();
    let c = Command::new("stunnel4")
        .arg(&conf)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn stunnel4 (Debian package stunnel4)");
    procs.add(name, c);
}

/// Print the stunnel logs of `names` (for a failing test's output).
pub(crate) fn print_stunnel_logs(dir: &Path, names: &[&str]) {
    for name in names {
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        eprintln!("--- {name}.log\n{text}");
    }
}

/// `tls.NAME` of a proxy summary.
pub(crate) fn tls_counter(s: &serde_json::Value, name: &str) -> u64 {
    s["tls"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("tls.{name} in {}", s["tls"]))
}

/// SIPp calls over TLS through the proxy, SIPp on both sides behind
/// stunnel (in the calling thread's network namespace):
///
///     SIPp UAC (TCP UA:5062) → stunnel client (UA:6060) → TLS → proxy `proxy`
///       → TLS → stunnel server (UA:5071) → SIPp UAS (TCP UA:5070)
///
/// The stunnels use `ca.pem` and `peer.pem`/`peer.key` of `dir`; the
/// client checks that the proxy's certificate names `proxy`'s IP.
pub(crate) struct StunnelCalls {
    /// The UAs' address (SIPp and stunnel on both sides).
    pub ua: IpAddr,
    /// The proxy's TLS address.
    pub proxy: SocketAddr,
    /// Mutual TLS: the UAC side presents `peer.pem`, the UAS side
    /// verifies the proxy's certificate.
    pub mutual: bool,
    /// Calls to make (20 per second).
    pub calls: u32,
}

impl StunnelCalls {
    /// Run them: SIPp's exit status and statistics (the stunnel logs are
    /// printed for a failing test's output).
    pub(crate) fn run(&self, procs: &mut Procs, dir: &Path) -> (Option<ExitStatus>, SippStats) {
        let at = |port: u16| SocketAddr::new(self.ua, port);
        // stunnel takes HOST:PORT with a bare IPv6 address (the last colon
        // ends it); checkIP a bare address.
        let host_port = |addr: SocketAddr| format!("{}:{}", addr.ip(), addr.port());
        // The UAC side: a client certificate only with mutual TLS.
        let client_cert = if self.mutual {
            "cert = peer.pem\nkey = peer.key\n"
        } else {
            ""
        };
        spawn_stunnel(
            procs,
            dir,
            "stunnel-uac",
            &format!(
                "[uac]\nclient = yes\naccept = {}\nconnect = {}\n\
                 CAfile = ca.pem\nverifyChain = yes\ncheckIP = {}\n{client_cert}",
                host_port(at(6060)),
                host_port(self.proxy),
                self.proxy.ip(),
            ),
        );
        // The UAS side: with mutual TLS it wants the proxy's certificate.
        let verify_proxy = if self.mutual {
            "CAfile = ca.pem\nverifyChain = yes\n"
        } else {
            ""
        };
        spawn_stunnel(
            procs,
            dir,
            "stunnel-uas",
            &format!(
                "[uas]\naccept = {}\nconnect = {}\n\
                 cert = peer.pem\nkey = peer.key\n{verify_proxy}",
                host_port(at(5071)),
                host_port(at(5070)),
            ),
        );
        let mut uas = uas_args(at(5070));
        uas.extend(["-t".into(), "t1".into()]);
        // Its Contact names the TLS address stunnel gives it, as a TLS
        // UAS's would (SIPp's `[local_ip]`: bracketed when IPv6; a literal
        // `[` would start a SIPp keyword).
        let scenario = std::fs::read_to_string(scenarios().join("uas_rr.xml"))
            .unwrap()
            .replace(
                "<sip:[local_ip]:[local_port];transport=[transport]>",
                "<sip:[local_ip]:5071;transport=tls>",
            );
        std::fs::write(dir.join("uas_tls.xml"), scenario).unwrap();
        let sf = uas.iter().position(|arg| arg == "-sf").unwrap() + 1;
        uas[sf] = dir.join("uas_tls.xml").display().to_string();
        spawn_sipp(procs, dir, &uas);
        for port in [6060, 5071, 5070] {
            wait_listening(&at(port).to_string());
        }
        let mut uac = uac_args(
            at(6060),
            at(5062),
            "bob",
            &format!("{};transport=tls", at(5071)),
            self.calls,
            20,
        );
        uac.extend(["-t".into(), "t1".into()]);
        // SIPp speaks TCP to stunnel but writes its Via as a TLS client
        // would (SIPp's own `[transport]` would say TCP).
        let scenario = std::fs::read_to_string(scenarios().join("uac_rr.xml"))
            .unwrap()
            .replace("SIP/2.0/[transport]", "SIP/2.0/TLS");
        std::fs::write(dir.join("uac_tls.xml"), scenario).unwrap();
        let sf = uac.iter().position(|arg| arg == "-sf").unwrap() + 1;
        uac[sf] = dir.join("uac_tls.xml").display().to_string();
        let outcome = run_sipp(procs, dir, "uac-tls", &uac, Duration::from_secs(60));
        eprintln!("sipp over tls: {:?} exit {:?}", outcome.1, outcome.0);
        print_stunnel_logs(dir, &["stunnel-uac", "stunnel-uas"]);
        outcome
    }
}
