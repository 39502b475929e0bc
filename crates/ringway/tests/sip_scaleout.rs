//! Several `ringway sip proxy` processes sharing one real redis-server
//! (Debian's, append-only file on) as location store, and `ringway sip
//! dispatch` in front of three of them. Each test runs in a private
//! network namespace of its own with only `lo`: Redis, the proxies, the
//! dispatcher and SIPp are started there and killed by PID (also when the
//! test fails); the namespace goes with the test's thread.
//!
//! Addresses: proxies at 127.0.0.11/12/13:5060, the dispatcher at
//! 127.0.0.1:5060, the registered UA (SIPp UAS) at 127.0.0.1:5072, the
//! caller (SIPp UAC) at 127.0.0.1:5071, Redis on a free port of 127.0.0.1.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PROXIES: [&str; 3] = ["127.0.0.11:5060", "127.0.0.12:5060", "127.0.0.13:5060"];
const UAS: &str = "127.0.0.1:5072";
const UAC: &str = "127.0.0.1:5071";
const DOMAIN: &str = "ringway.test";

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A redis-server of the test's own: append-only file with fsync at every
/// write (a SIGKILL loses nothing acknowledged), no RDB snapshots.
struct Redis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = Redis {
            port,
            dir: dir.to_path_buf(),
            child: None,
        };
        redis.launch();
        redis
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(["--daemonize", "no", "--protected-mode", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (Debian package redis-server)");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while self.command(&["PING"]).as_deref() != Some("+PONG") {
            assert!(Instant::now() < end, "redis-server did not answer PING");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, reaped (by PID).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// One command over RESP (inline), the first reply line.
    fn command(&self, args: &[&str]) -> Option<String> {
        let mut s = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_millis(200),
        )
        .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for arg in args {
            req.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).ok()?;
        Some(line.trim_end().to_string())
    }

    /// `redis-cli` (Debian redis-tools) with its output, for readable
    /// answers (arrays).
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli (Debian package redis-tools)");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A proxy at `listen` sharing Redis `url`.
fn proxy(procs: &mut Procs, dir: &Path, listen: &str, url: &str) -> ProxyProc {
    start_proxy(
        procs,
        dir,
        &[
            "--listen",
            listen,
            // Every UA of this test bed is on loopback (docs/security.md).
            "--relay",
            "127.0.0.0/8",
            "--mode",
            "stateful",
            "--registrar",
            "--domain",
            DOMAIN,
            "--min-expires",
            "1",
            "--location",
            url,
            "--location-timeout-ms",
            "200",
            "--workers",
            "1",
            "--backend",
            "socket",
        ],
    )
}

/// Write a SIPp scenario into `dir`.
fn scenario(dir: &Path, name: &str, xml: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, xml).unwrap();
    path.display().to_string()
}

/// A REGISTER of `sip:alice@DOMAIN` with contact UAS, CSeq and Expires as
/// given, expecting `expect` (and, for 500, a Retry-After). SIPp matches
/// replies to calls by Call-ID: the Call-ID is SIPp's own, set with
/// `-cid_str` ([`Scenario::call_id`]). The reply is matched to the
/// REGISTER by its transaction (Via branch), not by the CSeq method: SIPp
/// takes the first "CSeq" in the message for that, which is inside the
/// reason phrase of "400 Bad Request - CSeq Out Of Order".
fn register_scenario(dir: &Path, call_id: &str, cseq: u32, expires: u32, expect: u16) -> Scenario {
    let check = if expect == 500 {
        r#"<action><ereg regexp="[0-9]+" search_in="hdr" header="Retry-After:" check_it="true" assign_to="retry"/></action>"#
    } else {
        ""
    };
    // SIPp refuses a scenario with a variable assigned and never read.
    let reference = if expect == 500 {
        r#"<Reference variables="retry"/>"#
    } else {
        ""
    };
    let xml = format!(
        r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="register {expect}">
  <send retrans="500" start_txn="register"><![CDATA[

      REGISTER sip:{DOMAIN} SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:alice@{DOMAIN}>;tag=[pid]SIPpTag00[call_number]
      To: <sip:alice@{DOMAIN}>
      Call-ID: [call_id]
      CSeq: {cseq} REGISTER
      Contact: <sip:alice@{UAS}>
      Expires: {expires}
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
  <recv response="{expect}" response_txn="register">{check}</recv>{reference}
</scenario>
"#
    );
    Scenario {
        file: scenario(
            dir,
            &format!("register-{call_id}-{cseq}-{expect}.xml"),
            &xml,
        ),
        call_id: Some(call_id.to_string()),
    }
}

/// A SIPp scenario file and the Call-ID its one call uses (`None`: SIPp's).
struct Scenario {
    file: String,
    call_id: Option<String>,
}

/// An INVITE to `sip:alice@DOMAIN` expecting the failure `expect`, then
/// its ACK.
fn failing_invite_scenario(dir: &Path, expect: u16) -> Scenario {
    let xml = format!(
        r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="invite {expect}">
  <send retrans="500"><![CDATA[

      INVITE sip:alice@{DOMAIN} SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:alice@{DOMAIN}>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
  <recv response="100" optional="true"></recv>
  <recv response="{expect}"></recv>
  <send><![CDATA[

      ACK sip:alice@{DOMAIN} SIP/2.0
      [last_Via:]
      From: <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      [last_To:]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
</scenario>
"#
    );
    Scenario {
        file: scenario(dir, &format!("invite-{expect}.xml"), &xml),
        call_id: None,
    }
}

/// Run a one-call SIPp scenario against `remote` from `local`; whether
/// its one call succeeded.
fn sipp_once(
    procs: &mut Procs,
    dir: &Path,
    remote: &str,
    local: &str,
    scenario: &Scenario,
) -> bool {
    let local = a(local);
    let name = format!(
        "once-{}",
        Path::new(&scenario.file)
            .file_stem()
            .unwrap()
            .to_string_lossy()
    );
    let mut args: Vec<String> = [
        remote,
        "-sf",
        &scenario.file,
        "-i",
        &local.ip().to_string(),
        "-p",
        &local.port().to_string(),
        "-m",
        "1",
        "-timeout",
        "10",
        "-timeout_error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(call_id) = &scenario.call_id {
        args.extend(["-cid_str".to_string(), call_id.clone()]);
    }
    let (st, stats) = run_sipp(procs, dir, &name, &args, Duration::from_secs(20));
    st.is_some_and(|s| s.success()) && stats.successful == 1
}

/// The registered UA: a SIPp UAS on UAS answering every call.
fn start_uas(procs: &mut Procs, dir: &Path, trace: Option<&Path>) -> u32 {
    let mut args = uas_args(a(UAS));
    if let Some(trace) = trace {
        args.extend(["-trace_msg".into(), "-message_file".into()]);
        args.push(trace.display().to_string());
    }
    let pid = spawn_sipp(procs, dir, &args);
    std::thread::sleep(Duration::from_millis(300));
    pid
}

/// `calls` calls to alice through `remote`; SIPp's statistics.
fn call_alice(procs: &mut Procs, dir: &Path, remote: &str, calls: u32, name: &str) -> SippStats {
    let args = uac_args(a(remote), a(UAC), "alice", DOMAIN, calls, 20);
    let (st, stats) = run_sipp(procs, dir, name, &args, Duration::from_secs(60));
    eprintln!("{name}: {stats:?} exit {st:?}");
    stats
}

/// The registrar's binding of alice as Redis holds it.
fn stored_binding(redis: &Redis) -> String {
    redis.cli(&[
        "HGET",
        "rw:loc:{alice@ringway.test}",
        &format!("sip:alice@{UAS}"),
    ])
}

#[test]
fn registered_through_proxy_a_called_through_proxy_b() {
    let (a_summary, b_summary, calls) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        let pa = proxy(&mut procs, dir.path(), PROXIES[0], &redis.url());
        let pb = proxy(&mut procs, dir.path(), PROXIES[1], &redis.url());
        start_uas(&mut procs, dir.path(), None);
        let reg = register_scenario(dir.path(), "reg-ab", 1, 60, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &reg
        ));
        let stored = stored_binding(&redis);
        assert!(stored.contains(r#""i":"reg-ab","s":1"#), "{stored}");
        let calls = call_alice(&mut procs, dir.path(), PROXIES[1], 10, "calls-via-b");
        let b_summary = stop_proxy(&mut procs, &pb);
        let a_summary = stop_proxy(&mut procs, &pa);
        (a_summary, b_summary, calls)
    });
    assert_eq!((calls.successful, calls.failed), (10, 0), "{calls:?}");
    // A applied the REGISTER in Redis, B looked alice up there.
    assert_eq!(a_summary["location"]["counts"]["registers"], 1);
    assert_eq!(a_summary["by_type"]["REGISTER"]["responded"]["200"], 1);
    assert!(b_summary["location"]["counts"]["lookups"].as_u64().unwrap() >= 10);
    assert!(b_summary["proxy"]["store_deferred"].as_u64().unwrap() >= 10);
    assert!(type_count(&b_summary, "INVITE", "forwarded") >= 10);
    assert_eq!(b_summary["proxy"]["bindings"], serde_json::Value::Null);
    let lookup = &b_summary["location"]["lookup"]["added"];
    assert!(lookup["count"].as_u64().unwrap() >= 10, "{lookup}");
}

#[test]
fn unregister_through_one_proxy_is_seen_by_the_next_lookup_on_another() {
    let (before, after) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        proxy(&mut procs, dir.path(), PROXIES[0], &redis.url());
        proxy(&mut procs, dir.path(), PROXIES[1], &redis.url());
        start_uas(&mut procs, dir.path(), None);
        let reg = register_scenario(dir.path(), "reg-un", 1, 60, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &reg
        ));
        let before = call_alice(&mut procs, dir.path(), PROXIES[1], 2, "before");
        let unreg = register_scenario(dir.path(), "reg-un", 2, 0, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &unreg
        ));
        // Right after: no binding, so no route (404: no default route).
        let gone = failing_invite_scenario(dir.path(), 404);
        let after = sipp_once(&mut procs, dir.path(), PROXIES[1], UAC, &gone);
        assert_eq!(stored_binding(&redis), "", "the binding left Redis");
        (before, after)
    });
    assert_eq!(before.successful, 2, "{before:?}");
    assert!(
        after,
        "a call after the unregister got 404 from the other proxy"
    );
}

#[test]
fn out_of_order_cseq_through_a_second_proxy_is_refused() {
    let (stored, summary) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        proxy(&mut procs, dir.path(), PROXIES[0], &redis.url());
        let pb = proxy(&mut procs, dir.path(), PROXIES[1], &redis.url());
        let newer = register_scenario(dir.path(), "reg-oo", 5, 60, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &newer
        ));
        // The same Call-ID with a lower CSeq, through B: refused (400),
        // nothing changed.
        let older = register_scenario(dir.path(), "reg-oo", 3, 3600, 400);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[1],
            "127.0.0.1:5074",
            &older
        ));
        let stored = stored_binding(&redis);
        (stored, stop_proxy(&mut procs, &pb))
    });
    assert!(stored.contains(r#""i":"reg-oo","s":5"#), "{stored}");
    assert_eq!(summary["by_type"]["REGISTER"]["responded"]["400"], 1);
}

#[test]
fn a_binding_expires_on_time() {
    netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        proxy(&mut procs, dir.path(), PROXIES[0], &redis.url());
        proxy(&mut procs, dir.path(), PROXIES[1], &redis.url());
        start_uas(&mut procs, dir.path(), None);
        let started = Instant::now();
        let reg = register_scenario(dir.path(), "reg-ex", 5, 3, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &reg
        ));
        let registered = Instant::now();
        // Both keys expire with the binding (plus 10 s slack in Redis).
        let ttl: i64 = redis
            .cli(&["PTTL", "rw:exp:{alice@ringway.test}"])
            .parse()
            .unwrap();
        assert!((3_000..=13_000).contains(&ttl), "PTTL {ttl}");
        // Within its lifetime (3 s from Redis's clock at the REGISTER):
        // reachable through B.
        std::thread::sleep(Duration::from_millis(1500).saturating_sub(registered - started));
        let during = call_alice(&mut procs, dir.path(), PROXIES[1], 1, "during");
        assert_eq!(during.successful, 1, "{during:?}");
        // Just after it: gone at once (the index, not the key's slack).
        let deadline = registered + Duration::from_millis(3300);
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        let gone = failing_invite_scenario(dir.path(), 404);
        assert!(sipp_once(&mut procs, dir.path(), PROXIES[1], UAC, &gone));
        let live = redis.cli(&["ZRANGEBYSCORE", "rw:exp:{alice@ringway.test}", "(1", "+inf"]);
        assert!(!live.is_empty(), "the index still holds the expired entry");
        // A REGISTER prunes it first: the same Call-ID with a lower CSeq
        // is no longer out of order (the expired binding is gone).
        let other = register_scenario(dir.path(), "reg-ex", 2, 60, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &other
        ));
        let stored = stored_binding(&redis);
        assert!(stored.contains(r#""i":"reg-ex","s":2"#), "{stored}");
    });
}

#[test]
fn redis_restarted_mid_run_bindings_survive_and_registrations_resume() {
    let (a_summary, b_summary) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        let pa = proxy(&mut procs, dir.path(), PROXIES[0], &redis.url());
        let pb = proxy(&mut procs, dir.path(), PROXIES[1], &redis.url());
        start_uas(&mut procs, dir.path(), None);
        let reg = register_scenario(dir.path(), "reg-rs", 1, 60, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &reg
        ));
        // B looks alice up once, so the store thread her AOR hashes to
        // holds a connection that the restart then breaks.
        let before = call_alice(&mut procs, dir.path(), PROXIES[1], 1, "before-kill");
        assert_eq!(before.successful, 1);
        // Redis dies: REGISTER gets 500 with Retry-After, calls 480.
        redis.kill();
        let refused = register_scenario(dir.path(), "reg-rs", 2, 60, 500);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[0],
            "127.0.0.1:5073",
            &refused
        ));
        let unavailable = failing_invite_scenario(dir.path(), 480);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[1],
            UAC,
            &unavailable
        ));
        // Back (same port, same append-only file): the binding survived
        // and calls reach alice without her registering again...
        redis.launch();
        let end = Instant::now() + Duration::from_secs(6);
        let mut reached = false;
        while !reached && Instant::now() < end {
            reached =
                call_alice(&mut procs, dir.path(), PROXIES[1], 1, "after-restart").successful == 1;
        }
        assert!(reached, "calls reach alice after the restart");
        // ...and registrations resume without restarting ringway.
        let again = register_scenario(dir.path(), "reg-rs", 3, 60, 200);
        let end = Instant::now() + Duration::from_secs(6);
        let mut registered = false;
        while !registered && Instant::now() < end {
            registered = sipp_once(&mut procs, dir.path(), PROXIES[0], "127.0.0.1:5073", &again);
        }
        assert!(registered, "a REGISTER through A succeeds again");
        assert!(stored_binding(&redis).contains(r#""s":3"#));
        (stop_proxy(&mut procs, &pa), stop_proxy(&mut procs, &pb))
    });
    // Counted, never silent.
    assert!(
        a_summary["proxy"]["store_unavailable_registers"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(
        b_summary["proxy"]["store_unavailable_lookups"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(
        b_summary["by_type"]["INVITE"]["responded"]["480"]
            .as_u64()
            .unwrap()
            >= 1
    );
    for s in [&a_summary, &b_summary] {
        let c = &s["location"]["counts"];
        let failures = [
            "io_errors",
            "connect_failures",
            "skipped_backoff",
            "timeouts",
        ]
        .iter()
        .map(|k| c[k].as_u64().unwrap())
        .sum::<u64>();
        assert!(failures >= 1, "{c}");
        assert!(c["reconnects"].as_u64().unwrap() >= 1, "{c}");
    }
}

#[test]
fn a_reply_of_the_wrong_shape_is_counted_and_treated_as_unreachable() {
    let summary = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        let pb = proxy(&mut procs, dir.path(), PROXIES[1], &redis.url());
        // Someone else's data where alice's binding should be.
        redis.cli(&[
            "HSET",
            "rw:loc:{alice@ringway.test}",
            "sip:alice@127.0.0.1:5072",
            "not json",
        ]);
        redis.cli(&[
            "ZADD",
            "rw:exp:{alice@ringway.test}",
            "99999999999999",
            "sip:alice@127.0.0.1:5072",
        ]);
        let unavailable = failing_invite_scenario(dir.path(), 480);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[1],
            UAC,
            &unavailable
        ));
        // A REGISTER over it is refused the same way (nothing overwritten).
        let refused = register_scenario(dir.path(), "reg-bad", 1, 60, 500);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            PROXIES[1],
            "127.0.0.1:5073",
            &refused
        ));
        assert_eq!(stored_binding(&redis), "not json");
        stop_proxy(&mut procs, &pb)
    });
    assert!(
        summary["location"]["counts"]["bad_replies"]
            .as_u64()
            .unwrap()
            >= 2
    );
    assert!(
        summary["proxy"]["store_unavailable_lookups"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(
        summary["proxy"]["store_unavailable_registers"]
            .as_u64()
            .unwrap()
            >= 1
    );
}

/// A running `ringway sip dispatch`.
struct DispatchProc {
    pid: u32,
    summary: PathBuf,
    stderr: mpsc::Receiver<String>,
}

fn start_dispatch(procs: &mut Procs, dir: &Path, listen: &str) -> DispatchProc {
    let summary = dir.join("dispatch-summary.json");
    let mut c = Command::new(ringway());
    c.args(["sip", "dispatch", "--listen", listen]);
    // The UAs the proxies call back through the dispatcher are on loopback.
    c.args(["--relay", "127.0.0.0/8"]);
    for p in PROXIES {
        c.args(["--proxy", p]);
    }
    let mut c = c
        .args(["--probe-interval-ms", "100", "--probe-failures", "3"])
        .args([
            "--backend",
            "socket",
            "--duration",
            "120",
            "--quiet",
            "--summary",
        ])
        .arg(&summary)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringway sip dispatch");
    let err = c.stderr.take().unwrap();
    let pid = procs.add("dispatch", c);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[dispatch] {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let d = DispatchProc {
        pid,
        summary,
        stderr: rx,
    };
    wait_line(&d.stderr, "listening on", Duration::from_secs(20));
    d
}

/// Wait (bounded) for a stderr line containing `needle`.
fn wait_line(lines: &mpsc::Receiver<String>, needle: &str, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return,
            Ok(_) => {}
            Err(_) => panic!("no line with {needle:?} within {limit:?}"),
        }
    }
}

/// Call-ID → the proxy (index) whose Via the INVITE carried when it
/// reached the UAS, from SIPp's message log.
fn proxies_by_call_id(log: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut text = String::new();
    std::fs::File::open(log)
        .and_then(|mut f| f.read_to_string(&mut text))
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut map = std::collections::BTreeMap::new();
    for message in text.split("message received") {
        let Some(start) = message.find("INVITE sip:") else {
            continue;
        };
        let message = &message[start..];
        let head = message.split("\n\n").next().unwrap_or(message);
        let call_id = head
            .lines()
            .find_map(|l| l.strip_prefix("Call-ID:"))
            .map(|v| v.trim().to_string());
        let proxy = head
            .lines()
            .filter(|l| l.starts_with("Via:"))
            .find_map(|via| PROXIES.iter().position(|p| via.contains(&format!(" {p};"))));
        if let (Some(call_id), Some(proxy)) = (call_id, proxy) {
            map.entry(call_id).or_insert(proxy);
        }
    }
    map
}

#[test]
fn one_of_three_proxies_killed_behind_the_dispatcher() {
    const CALLS: u32 = 60;
    let (before, after, phase2, dispatch, killed) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let mut procs = Procs::default();
        let proxies: Vec<ProxyProc> = PROXIES
            .iter()
            .map(|p| proxy(&mut procs, dir.path(), p, &redis.url()))
            .collect();
        let d = start_dispatch(&mut procs, dir.path(), "127.0.0.1:5060");
        let trace1 = dir.path().join("uas-phase1.log");
        let uas = start_uas(&mut procs, dir.path(), Some(&trace1));
        // alice registers through the dispatcher: it lands on the proxy
        // rendezvous hashing picks for her AOR, with the dispatcher's Path.
        let reg = register_scenario(dir.path(), "reg-d", 1, 60, 200);
        assert!(sipp_once(
            &mut procs,
            dir.path(),
            "127.0.0.1:5060",
            "127.0.0.1:5073",
            &reg
        ));
        let stored = stored_binding(&redis);
        assert!(
            stored.contains(r#""p":["<sip:127.0.0.1:5060;lr>"]"#),
            "{stored}"
        );
        // The Call-IDs scaleout-1..=N@127.0.0.1: the same set on both runs.
        let run_calls = |procs: &mut Procs, name: &str| {
            let mut args = uac_args(a("127.0.0.1:5060"), a(UAC), "alice", DOMAIN, CALLS, 30);
            args.extend(["-cid_str".to_string(), "scaleout-%u@%s".to_string()]);
            let (st, stats) = run_sipp(procs, dir.path(), name, &args, Duration::from_secs(60));
            eprintln!("{name}: {stats:?} exit {st:?}");
            stats
        };
        let phase1 = run_calls(&mut procs, "phase1");
        assert_eq!((phase1.successful, phase1.failed), (CALLS as u64, 0));
        // Kill the proxy that holds alice's registration's share (its
        // REGISTER went there): the binding is in Redis, not in it.
        let killed = ringway_sip::dispatch::rendezvous::choose(
            format!("alice@{DOMAIN}").as_bytes(),
            PROXIES.iter().map(|p| (*p, true)),
        )
        .unwrap();
        let victim = procs.take(proxies[killed].pid).unwrap();
        drop(KillOnDrop(victim));
        wait_line(&d.stderr, "out (probes unanswered)", Duration::from_secs(5));
        // The UAS restarts its message log for phase 2.
        let mut c = procs.take(uas).unwrap();
        let _ = c.kill();
        let _ = c.wait();
        let trace2 = dir.path().join("uas-phase2.log");
        start_uas(&mut procs, dir.path(), Some(&trace2));
        let phase2 = run_calls(&mut procs, "phase2");
        signal(d.pid, "TERM");
        let mut c = procs.take(d.pid).unwrap();
        assert!(wait_bounded(&mut c, Duration::from_secs(10)).is_some_and(|s| s.success()));
        let dispatch: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&d.summary).unwrap()).unwrap();
        (
            proxies_by_call_id(&trace1),
            proxies_by_call_id(&trace2),
            phase2,
            dispatch,
            killed,
        )
    });
    // New calls keep succeeding.
    assert_eq!(
        (phase2.successful, phase2.failed),
        (CALLS as u64, 0),
        "{phase2:?}"
    );
    assert_eq!(before.len(), CALLS as usize, "{before:?}");
    assert_eq!(after.len(), CALLS as usize, "{after:?}");
    let mut moved = 0;
    for (call_id, &was) in &before {
        let now = after[call_id];
        if was == killed {
            assert_ne!(now, killed);
            moved += 1;
        } else {
            assert_eq!(now, was, "{call_id} moved off a surviving proxy");
        }
    }
    // About a third of the Call-IDs moved (the set is fixed, so this
    // number is too: it depends only on the hash).
    let share = moved as f64 / CALLS as f64;
    eprintln!("moved {moved} of {CALLS} Call-IDs ({share:.2})");
    assert!((0.2..=0.47).contains(&share), "moved {moved} of {CALLS}");
    let proxies = dispatch["dispatch"]["proxies"].as_array().unwrap();
    assert_eq!(proxies[killed]["alive"], false);
    assert_eq!(proxies[killed]["downs"], 1);
    assert!(dispatch["dispatch"]["requests_to_uri"].as_u64().unwrap() >= 2 * CALLS as u64);
}

/// SIGKILL a child and reap it.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn malformed_redis_urls_are_refused_at_start_up() {
    let refused = netns(|| {
        [
            "redis://127.0.0.1:0/0",
            "redis://127.0.0.1:6379/zero",
            "rediss://127.0.0.1:6379/0",
            "redis://",
            "memcached://127.0.0.1:11211",
        ]
        .iter()
        .map(|bad| {
            let out = Command::new(ringway())
                .args(["sip", "proxy", "--listen", "127.0.0.1:5060", "--registrar"])
                .args(["--domain", DOMAIN, "--location", bad, "--duration", "1"])
                .stdin(Stdio::null())
                .output()
                .expect("run ringway");
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            (
                bad.to_string(),
                out.status.code(),
                out.stdout.is_empty(),
                stderr,
            )
        })
        .collect::<Vec<_>>()
    });
    for (bad, code, no_summary, stderr) in refused {
        // A usage error before anything starts: no summary, exit status 2.
        assert_eq!(code, Some(2), "{bad}: {stderr}");
        assert!(no_summary, "{bad}");
        assert!(stderr.contains("--location"), "{bad}: {stderr}");
        assert!(
            stderr.contains("expected redis://HOST:PORT/DB"),
            "{bad}: {stderr}"
        );
    }
}

/// A REGISTER over TCP to a proxy whose store is Redis: the store step is
/// deferred to a store thread, and the `200` must still go back over the
/// REGISTER's connection (it once went out over UDP, which a TCP client
/// never reads). Redis keeps the binding's flow (transport, source
/// address, connection) and RFC 5626 instance and reg-id.
#[test]
fn a_register_over_tcp_deferred_to_redis_is_answered_over_its_connection() {
    let (answer, stored, summary) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let (tcp, redis_url) = (format!("tcp:{}", PROXIES[0]), redis.url());
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &tcp_registrar_on_redis(&tcp, &redis_url, &["--backend", "socket"]),
        );
        let mut s = TcpStream::connect(PROXIES[0]).expect("connect over TCP");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let local = s.local_addr().unwrap();
        let register = format!(
            "REGISTER sip:{DOMAIN} SIP/2.0\r\n\
Via: SIP/2.0/TCP 10.0.0.7:5060;branch=z9hG4bKtcpreg1\r\nMax-Forwards: 70\r\n\
From: <sip:alice@{DOMAIN}>;tag=t1\r\nTo: <sip:alice@{DOMAIN}>\r\nCall-ID: tcp-reg\r\n\
CSeq: 1 REGISTER\r\nSupported: outbound\r\n\
Contact: <sip:alice@10.0.0.7:5060;transport=tcp>;+sip.instance=\"<urn:uuid:1>\";reg-id=1\r\n\
Expires: 60\r\nContent-Length: 0\r\n\r\n"
        );
        s.write_all(register.as_bytes()).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        let stored = redis.cli(&[
            "HGET",
            &format!("rw:loc:{{alice@{DOMAIN}}}"),
            "sip:alice@10.0.0.7:5060;transport=tcp",
        ]);
        drop(s);
        let summary = stop_proxy(&mut procs, &p);
        (answer, (stored, local), summary)
    });
    let (stored, local) = stored;
    assert!(answer.starts_with("SIP/2.0 200 OK\r\n"), "{answer:?}");
    assert!(answer.contains("\r\nRequire: outbound\r\n"), "{answer}");
    assert!(summary["proxy"]["store_deferred"].as_u64().unwrap() >= 1);
    assert!(
        stored.contains(&format!(r#""f":{{"t":"tcp","a":"{local}","c":"#)),
        "{stored}"
    );
    assert!(
        stored.contains(r#""o":{"i":"<urn:uuid:1>","r":1}"#),
        "{stored}"
    );
}

/// Poll `redis` until `field` of `key` is gone (deadline `limit`).
fn wait_gone(redis: &Redis, key: &str, field: &str, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        if redis.cli(&["HGET", key, field]).is_empty() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Bindings in Redis go with their flow, as in memory: one registered
/// over TCP when its connection closes, one registered over UDP from
/// behind a NAT when it leaves three keepalives unanswered.
#[test]
fn bindings_in_redis_are_removed_when_their_flow_dies() {
    let (removed, summary) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let (tcp, redis_url) = (format!("tcp:{}", PROXIES[0]), redis.url());
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &tcp_registrar_on_redis(
                &tcp,
                &redis_url,
                &[
                    "--keepalive-interval",
                    "1",
                    "--keepalive-failures",
                    "3",
                    "--backend",
                    "socket",
                ],
            ),
        );
        // bob over TCP.
        let mut s = TcpStream::connect(PROXIES[0]).expect("connect over TCP");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let register = format!(
            "REGISTER sip:{DOMAIN} SIP/2.0\r\n\
Via: SIP/2.0/TCP 10.0.0.7:5060;branch=z9hG4bKtcpbob1\r\nMax-Forwards: 70\r\n\
From: <sip:bob@{DOMAIN}>;tag=t1\r\nTo: <sip:bob@{DOMAIN}>\r\nCall-ID: tcp-bob\r\n\
CSeq: 1 REGISTER\r\nContact: <sip:bob@10.0.0.7:5060;transport=tcp>\r\n\
Expires: 600\r\nContent-Length: 0\r\n\r\n"
        );
        s.write_all(register.as_bytes()).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(answer.starts_with("SIP/2.0 200 OK\r\n"), "{answer:?}");
        // alice over UDP from behind a NAT (a private Contact), silent.
        let ua = Command::new("python3")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/sip_proxy_support/keepalive_ua.py"),
            )
            .args(["udp", "127.0.0.11", "5060", "5090", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("run python3");
        procs.add("ua", ua);
        let bob_key = format!("rw:loc:{{bob@{DOMAIN}}}");
        let bob = "sip:bob@10.0.0.7:5060;transport=tcp";
        let alice_key = format!("rw:loc:{{alice@{DOMAIN}}}");
        let alice = "sip:alice@10.11.12.13:5060;transport=udp";
        let end = Instant::now() + Duration::from_secs(10);
        while redis.cli(&["HGET", &alice_key, alice]).is_empty() {
            assert!(Instant::now() < end, "alice never registered");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            redis
                .cli(&["HGET", &bob_key, bob])
                .contains(r#""f":{"t":"tcp""#),
            "bob's binding with its flow"
        );
        drop(s);
        let bob_gone = wait_gone(&redis, &bob_key, bob, Duration::from_secs(10));
        let alice_gone = wait_gone(&redis, &alice_key, alice, Duration::from_secs(30));
        let summary = stop_proxy(&mut procs, &p);
        ((bob_gone, alice_gone), summary)
    });
    assert_eq!(
        removed,
        (true, true),
        "(tcp closed, udp silent) gone from Redis"
    );
    let keepalive = &summary["keepalive"];
    assert_eq!(keepalive["removed_connection_closed"], 1, "{keepalive}");
    assert_eq!(keepalive["removed_keepalive"], 1, "{keepalive}");
    assert_eq!(keepalive["dead_udp_flows"], 1, "{keepalive}");
}

/// RFC 5626 7 over Redis: the registrar that gets `430 Flow Failed` from
/// an edge proxy removes the failed flow's binding from Redis (queued to
/// a store thread, never on a worker) and moves the call on to the UA's
/// other flow; the next call goes there at once (the same scenario as
/// `sip_proxy_flows.rs` with the bindings in memory).
#[test]
fn a_430_from_an_edge_removes_the_flows_binding_from_redis() {
    let (summary, calls, left) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let redis = Redis::start(dir.path());
        let url = redis.url();
        let mut procs = Procs::default();
        let (summary, calls) =
            registrar_acting_on_430(&mut procs, dir.path(), &["--location", &url]);
        let left = redis.cli(&["HKEYS", "rw:loc:{alice@ringway.test}"]);
        (summary, calls, left)
    });
    assert_eq!(calls, [true, true], "calls 2 and 3 over flow 2");
    let proxy = &summary["proxy"];
    assert_eq!(proxy["flow_failures_received"], 1, "{proxy}");
    assert_eq!(proxy["flow_retries"], 1, "{proxy}");
    assert_eq!(left, "sip:alice@10.0.0.7:5062;transport=tcp", "{left}");
    let counts = &summary["location"]["counts"];
    assert_eq!(counts["removals"], 1, "{counts}");
}

/// A registrar on `PROXIES[0]` over UDP and `tcp` (its `tcp:` listen
/// address), bindings in Redis at `redis_url`, then `more` arguments.
fn tcp_registrar_on_redis<'a>(tcp: &'a str, redis_url: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--listen",
        PROXIES[0],
        "--listen",
        tcp,
        "--registrar",
        "--domain",
        DOMAIN,
        "--location",
        redis_url,
    ];
    args.extend_from_slice(more);
    args
}
