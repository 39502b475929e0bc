//! Digest authentication of `ringway sip proxy --auth` with real peers in
//! a private network namespace with only `lo`: SIPp's `[authentication]`
//! (`-au/-ap`, MD5: Debian's SIPp speaks nothing else), `sipsak -a`, a
//! replayed and a malformed Authorization sent by hand, calls answering a
//! 407, and a credentials file that does not parse.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// docs/ringway-users.htdigest (alice/secret, bob/hunter2 in ringway.test).
fn users() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/ringway-users.htdigest")
        .display()
        .to_string()
}

/// Send `message` from `from` to the proxy and return the response's
/// status line and the whole response.
fn exchange(from: &str, message: &str) -> (String, String) {
    let socket = UdpSocket::bind(from).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    socket
        .send_to(message.as_bytes(), "127.0.0.1:5060")
        .unwrap();
    let mut buf = [0u8; 4096];
    let (n, _) = socket.recv_from(&mut buf).expect("a response");
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    (text.lines().next().unwrap_or("").to_string(), text)
}

/// The last authenticated REGISTER SIPp sent (from its -trace_msg log).
fn sent_register_with_credentials(dir: &Path) -> String {
    let log = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.display().to_string().contains("register_auth_")
                && p.display().to_string().ends_with("_messages.log")
        })
        .expect("SIPp message log");
    let text = std::fs::read_to_string(log).unwrap();
    let start = text.rfind("REGISTER sip:").expect("a REGISTER");
    let message = &text[start..];
    let end = message.find("\n\n").map_or(message.len(), |e| e + 2);
    message[..end]
        .replace('\n', "\r\n")
        .replace("\r\r\n", "\r\n")
}

#[allow(clippy::too_many_arguments)]
fn sipp_register(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    scenario: &str,
    aor: &str,
    user: &str,
    password: &str,
    port: &str,
) -> (Option<std::process::ExitStatus>, SippStats) {
    let args = register_sipp(scenario, aor, "127.0.0.1:5070", port)
        .digest(user, password, "ringway.test")
        .timeout(10)
        .arg("-trace_msg")
        .build();
    run_sipp(procs, dir, name, &args, Duration::from_secs(20))
}

fn sipsak(args: &[&str]) -> Option<i32> {
    let mut child = Command::new("sipsak")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sipsak");
    wait_bounded(&mut child, Duration::from_secs(15)).and_then(|s| s.code())
}

#[test]
fn register_challenged_authenticated_owned_and_replays_refused() {
    let checks = in_bed(|procs, dir| {
        let users = users();
        let proxy = start_loopback_proxy(
            procs,
            dir,
            &[
                "--mode",
                "stateful",
                "--workers",
                "2",
                "--registrar",
                "--domain",
                "ringway.test",
                "--auth",
                "--auth-file",
                &users,
                // One realm also for requests to 127.0.0.1 (sipsak cannot
                // send to a name it cannot resolve), MD5 first for SIPp.
                "--auth-realm",
                "ringway.test",
                "--auth-algorithm",
                "md5",
                "--auth-algorithm",
                "sha-256",
            ],
        );
        // REGISTER: 401, then SIPp's [authentication] -> 200.
        let (st, reg) = sipp_register(
            procs,
            dir,
            "register_auth",
            "register_auth.xml",
            "alice",
            "alice",
            "secret",
            "5062",
        );
        assert!(st.is_some_and(|s| s.success()), "alice REGISTER: {reg:?}");
        assert_eq!((reg.successful, reg.failed), (1, 0));
        // The same Authorization on a new REGISTER (new branch, CSeq):
        // a replay, challenged again.
        let replay = sent_register_with_credentials(dir)
            .replace("CSeq: 2 REGISTER", "CSeq: 3 REGISTER")
            .replace(";branch=z9hG4bK", ";branch=z9hG4bKreplay")
            // Responses go to the Via's sent-by: ours.
            .replace("UDP 127.0.0.1:5062;", "UDP 127.0.0.1:5064;");
        let (replayed, replayed_text) = exchange("127.0.0.1:5064", &replay);
        // Malformed credentials: 400.
        let malformed = replay
            .replace("CSeq: 3 REGISTER", "CSeq: 4 REGISTER")
            .replace("z9hG4bKreplay", "z9hG4bKbad")
            .replace("UDP 127.0.0.1:5064;", "UDP 127.0.0.1:5065;")
            .replace(
                "Authorization: Digest username=\"alice\",",
                "Authorization: Digest username=\"alice\",,",
            );
        let (malformed, _) = exchange("127.0.0.1:5065", &malformed);
        // bob's valid credentials for alice's AOR: 403 (the scenario's
        // last step expects it).
        let (st, forbidden) = sipp_register(
            procs,
            dir,
            "forbidden",
            "register_auth_forbidden.xml",
            "alice",
            "bob",
            "hunter2",
            "5063",
        );
        assert!(
            st.is_some_and(|s| s.success()),
            "bob for alice: {forbidden:?}"
        );
        // sipsak -a: REGISTER answered, then a wrong password.
        let base = [
            "-U",
            "-C",
            "sip:bob@127.0.0.1:5072",
            "-s",
            "sip:bob@127.0.0.1:5060",
            "-u",
            "bob",
            "-x",
            "600",
        ];
        let good = sipsak(&[&base[..], &["-a", "hunter2"]].concat());
        let bad = sipsak(&[&base[..], &["-a", "wrong"]].concat());
        let summary = stop_proxy(procs, &proxy);
        (replayed, replayed_text, malformed, good, bad, summary)
    });
    let (replayed, replayed_text, malformed, sipsak_good, sipsak_bad, s) = checks;
    assert_eq!(replayed, "SIP/2.0 401 Unauthorized", "{replayed_text}");
    assert!(replayed_text.contains("WWW-Authenticate: Digest realm=\"ringway.test\""));
    assert!(malformed.starts_with("SIP/2.0 400 "), "{malformed}");
    assert_eq!(sipsak_good, Some(0), "sipsak -a with the right password");
    assert_eq!(sipsak_bad, Some(1), "sipsak -a with a wrong password");
    let responded = &s["by_type"]["REGISTER"]["responded"];
    // alice 200, sipsak 200; challenges for alice, bob, sipsak x2, the replay.
    assert_eq!(responded["200"], 2, "{responded}");
    assert!(responded["401"].as_u64().unwrap() >= 5, "{responded}");
    // bob for alice's AOR, sipsak's wrong password.
    assert_eq!(responded["403"], 2, "{responded}");
    assert_eq!(responded["400"], 1, "{responded}");
    assert_eq!(s["proxy"]["auth_replays"], 1, "{}", s["proxy"]);
    // alice and bob bound; nothing for bob's attempt on alice's AOR.
    assert_eq!(s["proxy"]["bindings"], 2);
}

#[test]
fn calls_answer_407_in_both_modes() {
    for mode in ["stateless", "stateful"] {
        let users = users();
        let (s, calls) = with_loopback_proxy(
            &[
                "--mode",
                mode,
                "--domain",
                "ringway.test",
                "--auth",
                "--auth-file",
                &users,
                "--auth-algorithm",
                "md5",
            ],
            move |procs, dir| {
                start_loopback_uas(procs, dir);
                let args = uac_auth_args(10, 20, Some(100));
                let (st, calls) = run_sipp(procs, dir, "uac", &args, Duration::from_secs(40));
                assert!(st.is_some_and(|s| s.success()), "{mode}: {calls:?}");
                calls
            },
        );
        assert_eq!((calls.successful, calls.failed), (10, 0), "{mode}");
        assert_eq!(
            s["by_type"]["INVITE"]["responded"]["407"], 10,
            "{mode}: {}",
            s["by_type"]["INVITE"]
        );
        assert_eq!(s["proxy"]["auth_accepted"], 10, "{mode}");
        // The ACKs for the 407s are the proxy's: never forwarded.
        assert_eq!(
            type_count(&s, "ACK", "forwarded"),
            10,
            "{mode}: {}",
            s["by_type"]["ACK"]
        );
    }
}

#[test]
fn bad_credentials_file_stops_start_up_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file: PathBuf = dir.path().join("users");
    std::fs::write(&file, "alice:ringway.test:0123\n").unwrap();
    let out = Command::new(ringway())
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .args([
            "sip",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--auth",
            "--auth-file",
        ])
        .arg(&file)
        .args(["--duration", "1", "--quiet"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("users:1: HA1"), "{stderr}");
}

/// Wait (bounded) for a stderr line of `p` containing `needle`; the lines
/// seen on the way.
fn wait_stderr(p: &ProxyProc, needle: &str) -> Vec<String> {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        match p.stderr.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => panic!("no {needle:?} in {seen:?}"),
        }
    }
}

/// Two registrars (as behind one dispatcher) with one nonce secret
/// (`--auth-secret-file`, the same contents): SIPp's REGISTER is
/// challenged by A (127.0.0.1:5060) and its answer goes to B
/// (127.0.0.2:5060, SIPp's `setdest`), which accepts it. Then B's secret
/// file changes and B reloads (SIGHUP): A's challenge answered at B gets a
/// new 401, the registration fails. The secret shows in no log line and no
/// summary.
#[test]
fn a_challenge_from_one_proxy_is_answered_at_another_sharing_the_secret() {
    const SECRET: &str = "correct horse battery staple 42";
    let out = in_bed(|procs, dir| {
        let users = users();
        let (key_a, key_b) = (dir.join("a.secret"), dir.join("b.secret"));
        std::fs::write(&key_a, format!("{SECRET}\n")).unwrap();
        std::fs::write(&key_b, SECRET).unwrap();
        let args = |listen: &'static str, key: &Path| -> Vec<String> {
            strings(&[
                "--listen",
                listen,
                "--mode",
                "stateful",
                "--registrar",
                "--domain",
                "ringway.test",
                "--auth",
                "--auth-file",
                &users,
                "--auth-realm",
                "ringway.test",
                "--auth-algorithm",
                "md5",
                "--auth-secret-file",
                key.to_str().unwrap(),
            ])
        };
        let (args_a, args_b) = (
            args("127.0.0.1:5060", &key_a),
            args("127.0.0.2:5060", &key_b),
        );
        let a = start_proxy(
            procs,
            dir,
            &args_a.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let b = start_proxy(
            procs,
            dir,
            &args_b.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let moved = |procs: &mut Procs, name: &str, port: &str| {
            let args = register_sipp("register_auth_moved.xml", "alice", "127.0.0.1:5070", port)
                .digest("alice", "secret", "ringway.test")
                .key("other_host", "127.0.0.2")
                .key("other_port", "5060")
                .timeout(10)
                .build();
            run_sipp(procs, dir, name, &args, Duration::from_secs(20)).1
        };
        let shared = moved(procs, "moved-shared", "5062");
        // B's secret changes; SIGHUP re-reads it.
        std::fs::write(&key_b, "another secret, not the one A has").unwrap();
        signal(b.pid, "HUP");
        let mut lines = wait_stderr(&b, "reloaded");
        let differ = moved(procs, "moved-other", "5063");
        lines.extend(a.startup.iter().cloned());
        lines.extend(b.startup.iter().cloned());
        lines.extend(a.stderr.try_iter());
        lines.extend(b.stderr.try_iter());
        let (summary_a, summary_b) = (stop_proxy(procs, &a), stop_proxy(procs, &b));
        lines.extend(a.stderr.try_iter());
        lines.extend(b.stderr.try_iter());
        (shared, differ, summary_a, summary_b, lines)
    });
    let (shared, differ, a, b, lines) = out;
    assert_eq!((shared.successful, shared.failed), (1, 0), "{shared:?}");
    assert_eq!((differ.successful, differ.failed), (0, 1), "{differ:?}");
    // A challenged both first REGISTERs; B accepted the first answer and
    // challenged the second anew.
    assert_eq!(
        a["by_type"]["REGISTER"]["responded"]["401"], 2,
        "{}",
        a["by_type"]
    );
    assert_eq!(
        b["by_type"]["REGISTER"]["responded"]["200"], 1,
        "{}",
        b["by_type"]
    );
    assert_eq!(
        b["by_type"]["REGISTER"]["responded"]["401"], 1,
        "{}",
        b["by_type"]
    );
    assert_eq!(b["proxy"]["auth_accepted"], 1, "{}", b["proxy"]);
    assert!(
        lines.iter().any(|l| l.contains("auth_secret_file")),
        "the reload names the key it applied: {lines:?}"
    );
    for text in lines.iter().cloned().chain([a.to_string(), b.to_string()]) {
        assert!(!text.contains(SECRET), "the secret leaked: {text}");
        assert!(
            !text.contains("another secret"),
            "the secret leaked: {text}"
        );
    }
}
