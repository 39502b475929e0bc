//! Operating a running `ringway sip proxy` (issue 22), in a private
//! network namespace: `ringway ctl` lists and deletes a binding (the
//! deleted AOR is no longer reachable); SIGTERM drains with calls in
//! flight (they complete, new ones get 503, exit 0); SIGHUP and
//! `ringway ctl reload` re-read the config and the credentials during a
//! SIPp run with no failed call, and an invalid config is refused.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `ringway ctl --socket SOCKET ARGS…`: exit code and stdout.
fn ctl(socket: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(ringway())
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run ringway ctl");
    eprintln!(
        "[ctl {args:?}] {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn ctl_json(socket: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, out) = ctl(socket, &all);
    assert_eq!(code, Some(0), "ctl {args:?}: {out}");
    serde_json::from_str(&out).expect("ctl --json prints JSON")
}

/// Run the REGISTER `sipp` (see [`register_sipp`]) as `name`, bounded.
fn register(procs: &mut Procs, dir: &Path, name: &str, sipp: Sipp) -> SippStats {
    let args = sipp.timeout(10).build();
    run_sipp(procs, dir, name, &args, Duration::from_secs(20)).1
}

/// One call from SIPp on 127.0.0.1:`port` to `user@ringway.test` through
/// the proxy (its binding says where the UAS is).
fn call(procs: &mut Procs, dir: &Path, name: &str, user: &str, port: u16) -> SippStats {
    let mut args = uac_args(
        "127.0.0.1:5060".parse().unwrap(),
        format!("127.0.0.1:{port}").parse().unwrap(),
        user,
        "ringway.test",
        1,
        1,
    );
    // Bounded: an unanswered INVITE fails the call in 5 s.
    let at = args.iter().position(|a| a == "40").unwrap();
    args[at] = "5".into();
    run_sipp(procs, dir, name, &args, Duration::from_secs(20)).1
}

/// SIPp calls from 127.0.0.1:5061 to bob at the UAS 127.0.0.1:5070
/// through the proxy (or dispatcher) on 127.0.0.1:5060.
fn calls_to_bob(calls: u32, rate: u32) -> Vec<String> {
    uac_args(
        "127.0.0.1:5060".parse().unwrap(),
        "127.0.0.1:5061".parse().unwrap(),
        "bob",
        "127.0.0.1:5070",
        calls,
        rate,
    )
}

/// The loopback bed's stateful proxy with its management socket `socket`
/// and a drain deadline of `drain_timeout_s` after SIGTERM.
fn draining_proxy(procs: &mut Procs, dir: &Path, socket: &Path, drain_timeout_s: u32) -> ProxyProc {
    let drain_timeout = drain_timeout_s.to_string();
    start_loopback_proxy(
        procs,
        dir,
        &[
            "--mode",
            "stateful",
            "--manage-socket",
            socket.to_str().unwrap(),
            "--drain-timeout",
            &drain_timeout,
        ],
    )
}

/// A SIPp UAS on 127.0.0.1:5070 that rings `ringing_ms` before it
/// answers (uas_rr.xml with a longer pause).
fn spawn_ringing_uas(procs: &mut Procs, dir: &Path, ringing_ms: u32) -> u32 {
    let ringing = std::fs::read_to_string(scenarios().join("uas_rr.xml"))
        .unwrap()
        .replace(
            r#"<pause milliseconds="20"/>"#,
            &format!(r#"<pause milliseconds="{ringing_ms}"/>"#),
        );
    let path = dir.join("uas_ringing.xml");
    std::fs::write(&path, ringing).unwrap();
    let mut uas = uas_args("127.0.0.1:5070".parse().unwrap());
    uas[1] = path.display().to_string();
    spawn_sipp(procs, dir, &uas)
}

/// Poll the proxy's status (bounded by `limit`) until at least `at_least`
/// transactions are pending; the last count seen.
fn wait_pending(socket: &Path, at_least: u64, limit: Duration) -> u64 {
    let until = Instant::now() + limit;
    let mut pending = 0;
    while Instant::now() < until {
        pending = ctl_json(socket, &["status"])["transactions_pending"]
            .as_u64()
            .unwrap();
        if pending >= at_least {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    pending
}

/// After SIGTERM: the proxy's exit (waited for at most `limit`) and its
/// "drained in" line, if it printed one.
fn exit_after_drain(
    procs: &mut Procs,
    p: &ProxyProc,
    limit: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let mut child = procs.take(p.pid).unwrap();
    let exit = wait_bounded(&mut child, limit);
    let drained_line = p
        .stderr
        .try_iter()
        .find(|l| l.contains("drained in"))
        .unwrap_or_default();
    (exit, drained_line)
}

#[test]
fn ctl_lists_and_deletes_a_binding_which_is_then_unreachable() {
    let (listed, human, removed, after, before_call, after_call, sipsak_ok) =
        in_bed(|procs, dir| {
            let socket = dir.join("manage.sock");
            let p = start_loopback_proxy(
                procs,
                dir,
                &[
                    "--mode",
                    "stateful",
                    "--registrar",
                    "--domain",
                    "ringway.test",
                    "--manage-socket",
                    socket.to_str().unwrap(),
                ],
            );
            spawn_sipp(procs, dir, &uas_args("127.0.0.1:5070".parse().unwrap()));
            let bob_register = register_sipp("register.xml", "bob", "127.0.0.1:5070", "5066");
            let bob = register(procs, dir, "reg-bob", bob_register);
            assert_eq!((bob.successful, bob.failed), (1, 0), "bob registered");
            // sipsak too (usrloc mode: REGISTER, answered 200).
            let sipsak_ok = Command::new("timeout")
                .args(["20", "sipsak", "-U", "-C", "sip:carol@127.0.0.1:5072"])
                .args(["-s", "sip:carol@127.0.0.1:5060", "-x", "600", "-vv"])
                .output()
                .expect("run sipsak");
            let sipsak_ok = sipsak_ok.status.success();
            let listed = ctl_json(&socket, &["bindings"]);
            let (_, human) = ctl(&socket, &["bindings", "bob@ringway.test"]);
            let before_call = call(procs, dir, "call-before", "bob", 5061);
            let removed = ctl_json(&socket, &["unbind", "bob@ringway.test"]);
            let after = ctl_json(&socket, &["bindings"]);
            let after_call = call(procs, dir, "call-after", "bob", 5062);
            // Removing it again: 404, exit code 1.
            let (again, _) = ctl(&socket, &["unbind", "bob@ringway.test"]);
            assert_eq!(again, Some(1), "a second unbind finds nothing");
            stop_proxy(procs, &p);
            (
                listed,
                human,
                removed,
                after,
                before_call,
                after_call,
                sipsak_ok,
            )
        });
    let aors: Vec<&str> = listed["aors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["aor"].as_str().unwrap())
        .collect();
    assert!(aors.contains(&"bob@ringway.test"), "{listed}");
    assert!(sipsak_ok, "sipsak REGISTER answered 200");
    // Our own address stands for the first served domain.
    assert!(
        aors.contains(&"carol@ringway.test"),
        "sipsak's binding listed: {listed}"
    );
    assert!(
        human.contains("bob@ringway.test") && human.contains("sip:bob@127.0.0.1:5070"),
        "{human}"
    );
    assert_eq!(removed["removed"], 1, "{removed}");
    let after: Vec<&str> = after["aors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["aor"].as_str().unwrap())
        .collect();
    assert!(!after.contains(&"bob@ringway.test"), "{after:?}");
    assert!(
        after.contains(&"carol@ringway.test"),
        "only bob's went: {after:?}"
    );
    assert_eq!(
        (before_call.successful, before_call.failed),
        (1, 0),
        "bob reachable while bound"
    );
    assert_eq!(
        (after_call.successful, after_call.failed),
        (0, 1),
        "bob unreachable once unbound"
    );
}

/// `--drain-dialogs`: a drain also waits for the calls set up through the
/// proxy (stateful, Record-Route) and relays their in-dialog requests. One
/// SIPp call holds 4 s; SIGTERM comes once `ctl status` shows its dialog;
/// the BYE comes after the drain's idle time (1 s) and is relayed (SIPp:
/// one successful call), and the proxy exits 0 once the dialog ended
/// (well before its 30 s deadline). A drain that does not wait for
/// dialogs exits after the idle time, and the BYE goes nowhere: the call
/// fails.
#[test]
fn a_drain_waiting_for_dialogs_relays_the_bye_of_an_established_call() {
    let (exit, calls, status) = in_bed(|procs, dir| {
        let socket = dir.join("manage.sock");
        let p = start_loopback_proxy(
            procs,
            dir,
            &[
                "--mode",
                "stateful",
                "--manage-socket",
                socket.to_str().unwrap(),
                "--drain-dialogs",
            ],
        );
        start_loopback_uas(procs, dir);
        let mut args = uac_args(
            "127.0.0.1:5060".parse().unwrap(),
            "127.0.0.1:5061".parse().unwrap(),
            "bob",
            "127.0.0.1:5070",
            1,
            1,
        );
        let hold = args.iter().position(|a| a == "-d").unwrap() + 1;
        args[hold] = "4000".into();
        let uac = spawn_sipp_with_stats(procs, dir, "uac", &args);
        let end = Instant::now() + Duration::from_secs(20);
        let status = loop {
            let status = ctl_json(&socket, &["status"]);
            if status["dialogs_open"] == 1 {
                break status;
            }
            assert!(Instant::now() < end, "no dialog: {status}");
            std::thread::sleep(Duration::from_millis(20));
        };
        signal(p.pid, "TERM");
        let mut child = procs.take(p.pid).unwrap();
        let exit = wait_bounded(&mut child, Duration::from_secs(40));
        let (_, calls) = finish_sipp(procs, dir, "uac", uac, Duration::from_secs(60));
        (exit, calls, status)
    });
    assert_eq!(status["transactions_pending"], 0, "{status}");
    assert!(
        exit.is_some_and(|s| s.success()),
        "drained proxy exits 0: {exit:?}"
    );
    assert_eq!(
        (calls.successful, calls.failed),
        (1, 0),
        "the BYE was relayed during the drain: {calls:?}"
    );
}

/// SIGTERM with calls in flight (the UAS rings 1.5 s before answering):
/// every call the proxy had taken completes (ACK and BYE included), new
/// INVITEs and an OPTIONS probe get 503, and the proxy exits 0 once
/// nothing waits for a final response.
#[test]
fn sigterm_drains_calls_in_flight_and_exits_zero() {
    let calls: u32 = std::env::var("RINGWAY_DRAIN_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rate = calls / 2;
    let (in_flight, options, exit, drained_line, sipp, summary_503, refusals) =
        in_bed(move |procs, dir| {
            let socket = dir.join("manage.sock");
            let p = draining_proxy(procs, dir, &socket, 20);
            spawn_ringing_uas(procs, dir, 1500);
            let uac_pid = spawn_sipp_with_stats(procs, dir, "uac", &calls_to_bob(calls, rate));
            // Half the calls are ringing: drain.
            let in_flight = wait_pending(&socket, u64::from(calls / 4), Duration::from_secs(10));
            signal(p.pid, "TERM");
            std::thread::sleep(Duration::from_millis(100));
            let options = Command::new("timeout")
                .args([
                    "10",
                    "sipsak",
                    "-s",
                    "sip:127.0.0.1:5060",
                    "-H",
                    "127.0.0.1",
                    "-vv",
                ])
                .output()
                .expect("run sipsak");
            let options = String::from_utf8_lossy(&options.stdout).into_owned();
            let (exit, drained_line) = exit_after_drain(procs, &p, Duration::from_secs(30));
            let (_, sipp) = finish_sipp(procs, dir, "uac", uac_pid, Duration::from_secs(60));
            let summary: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p.summary).unwrap()).unwrap();
            let summary_503 = summary["by_type"]["INVITE"]["responded"]["503"]
                .as_u64()
                .unwrap_or(0);
            let refusals = summary["proxy"]["drain_refusals"].as_u64().unwrap();
            (
                in_flight,
                options,
                exit,
                drained_line,
                sipp,
                summary_503,
                refusals,
            )
        });
    eprintln!(
        "drain: {in_flight} INVITEs pending at SIGTERM; {drained_line}; SIPp {sipp:?}; 503 to INVITE {summary_503}; refusals {refusals}"
    );
    assert!(
        exit.is_some_and(|s| s.success()),
        "exit 0 after the drain: {exit:?}"
    );
    assert!(drained_line.contains("drained in"), "{drained_line}");
    assert!(
        options.contains("SIP/2.0 503"),
        "OPTIONS while draining: {options}"
    );
    assert!(
        in_flight >= u64::from(calls / 4),
        "calls were in flight: {in_flight}"
    );
    assert_eq!(sipp.successful + sipp.failed, u64::from(calls), "{sipp:?}");
    // Every call in flight at SIGTERM completed (ACK and BYE went through).
    assert!(
        sipp.successful >= in_flight,
        "{sipp:?} vs {in_flight} in flight"
    );
    // The failed ones are those refused with 503 (not timeouts).
    assert_eq!(sipp.failed, summary_503, "{sipp:?}");
    assert!(refusals > summary_503, "OPTIONS refused too: {refusals}");
}

/// The proxy's config file, with `flood` requests per window.
fn write_config(path: &Path, users: &Path, flood: u32) {
    std::fs::write(
        path,
        format!(
            r#"[sip.proxy]
listen = "127.0.0.1:5060"
mode = "stateful"
registrar = true
domain = ["ringway.test"]
relay = "127.0.0.0/8"
auth = true
auth-file = "{}"
auth-realm = "ringway.test"
auth-algorithm = ["md5", "sha-256"]
flood-limit = {flood}
flood-exempt = ["127.0.0.1"]
"#,
            users.display()
        ),
    )
    .unwrap();
}

/// REGISTER `user` (password `password`) with SIPp's digest answer.
fn register_auth(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    user: &str,
    password: &str,
    port: &str,
) -> SippStats {
    let sipp = register_sipp("register_auth.xml", user, "127.0.0.1:5070", port).digest(
        user,
        password,
        "ringway.test",
    );
    register(procs, dir, name, sipp)
}

/// Ten reloads (SIGHUP and `ringway ctl reload`) during a SIPp run with
/// digest authentication: no call fails; a user added to the credentials
/// file registers after a reload; an invalid config is refused with its
/// reason and the old one still serves.
#[test]
fn reloads_during_calls_add_a_credential_and_refuse_an_invalid_config() {
    let out = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("manage.sock");
        let users = dir.path().join("users.htdigest");
        let sample = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ringway-users.htdigest"),
        )
        .unwrap();
        let alice_only: String = sample
            .lines()
            .filter(|l| l.starts_with("alice:"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&users, &alice_only).unwrap();
        let config = dir.path().join("ringway.toml");
        write_config(&config, &users, 1000);
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &[
                "--config",
                config.to_str().unwrap(),
                "--manage-socket",
                socket.to_str().unwrap(),
            ],
        );
        spawn_sipp(
            &mut procs,
            dir.path(),
            &uas_args("127.0.0.1:5070".parse().unwrap()),
        );
        let bob_before = register_auth(
            &mut procs,
            dir.path(),
            "bob-before",
            "bob",
            "hunter2",
            "5066",
        );
        let uac_pid = spawn_sipp_with_stats(
            &mut procs,
            dir.path(),
            "uac",
            &uac_auth_args(100, 20, Some(100)),
        );
        let mut reloads = Vec::new();
        for i in 0..10 {
            std::thread::sleep(Duration::from_millis(400));
            if i == 4 {
                // The credential file gains bob; flood limit changes.
                std::fs::write(&users, &sample).unwrap();
                write_config(&config, &users, 2000);
            }
            if i % 2 == 0 {
                signal(p.pid, "HUP");
                reloads.push(0);
            } else {
                reloads.push(ctl(&socket, &["reload"]).0.unwrap_or(-1));
            }
        }
        let (_, calls) = finish_sipp(
            &mut procs,
            dir.path(),
            "uac",
            uac_pid,
            Duration::from_secs(60),
        );
        let bob_after = register_auth(
            &mut procs,
            dir.path(),
            "bob-after",
            "bob",
            "hunter2",
            "5067",
        );
        // An invalid config: refused, the old one stays.
        write_config(&config, &users, 0);
        let (refused_code, _) = ctl(&socket, &["reload"]);
        let refused = Command::new(ringway())
            .args([
                "ctl",
                "--json",
                "--socket",
                socket.to_str().unwrap(),
                "reload",
            ])
            .output()
            .unwrap();
        let refused_json = String::from_utf8_lossy(&refused.stdout).into_owned();
        let alice_after = register_auth(
            &mut procs,
            dir.path(),
            "alice-after",
            "alice",
            "secret",
            "5068",
        );
        let status = ctl_json(&socket, &["status"]);
        stop_proxy(&mut procs, &p);
        (
            bob_before,
            calls,
            reloads,
            bob_after,
            refused_code,
            refused_json,
            alice_after,
            status,
        )
    });
    let (bob_before, calls, reloads, bob_after, refused_code, refused_json, alice_after, status) =
        out;
    eprintln!("calls across reloads: {calls:?}; status {status}");
    assert_eq!(bob_before.successful, 0, "bob unknown before the reload");
    assert_eq!(
        (calls.successful, calls.failed),
        (100, 0),
        "no call failed across reloads"
    );
    assert!(reloads.iter().all(|&c| c == 0), "{reloads:?}");
    assert_eq!(
        (bob_after.successful, bob_after.failed),
        (1, 0),
        "bob added by a reload"
    );
    assert_eq!(refused_code, Some(1), "an invalid config is refused");
    assert!(
        refused_json.contains("reload refused") && refused_json.contains("flood"),
        "{refused_json}"
    );
    assert_eq!(
        (alice_after.successful, alice_after.failed),
        (1, 0),
        "the old config still serves"
    );
    assert_eq!(status["reloads"], 10, "{status}");
    assert_eq!(status["reloads_refused"], 2, "{status}");
}

/// One request from a UDP socket of the test (127.0.0.1:`port`) to the
/// proxy on 127.0.0.1:5060; the first reply's text (empty after 5 s).
fn ask(method: &str, port: u16) -> String {
    let socket = std::net::UdpSocket::bind(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let body = if method == "INVITE" { "v=0\r\n" } else { "" };
    let request = format!(
        "{method} sip:bob@127.0.0.1:5070 SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-drain-{method}\r\n\
Max-Forwards: 70\r\nFrom: <sip:probe@127.0.0.1:{port}>;tag=drain\r\n\
To: <sip:bob@127.0.0.1:5070>\r\nCall-ID: drain-{method}@127.0.0.1\r\n\
CSeq: 1 {method}\r\nContact: <sip:probe@127.0.0.1:{port}>\r\n\
Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket
        .send_to(request.as_bytes(), "127.0.0.1:5060")
        .unwrap();
    let mut buf = [0u8; 4096];
    // A 100 Trying would come first for an INVITE the proxy took: skip it.
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                if !text.starts_with("SIP/2.0 1") {
                    return text;
                }
            }
            Err(_) => break,
        }
    }
    String::new()
}

/// SIGTERM with about 1 000 calls in flight (`RINGWAY_DRAIN_CALLS`; the
/// SIPp UAS rings 8 s before it answers, so every INVITE the UAC sent is
/// a pending transaction of the stateful proxy): a new INVITE gets 503
/// with Retry-After, an OPTIONS probe 503, every call in flight completes
/// (the UAC counts 0 failed), and the proxy exits 0 within its drain
/// deadline. Prints the drain time.
#[test]
fn sigterm_with_a_thousand_calls_in_flight_finishes_them_and_exits_zero() {
    let calls: u32 = std::env::var("RINGWAY_DRAIN_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let out = in_bed(move |procs, d| {
        let socket = d.join("manage.sock");
        let p = draining_proxy(procs, d, &socket, 40);
        spawn_ringing_uas(procs, d, 8000);
        std::thread::sleep(Duration::from_millis(300));
        let mut uac = calls_to_bob(calls, 500);
        // Every call open at once (SIPp's default limit is 3 x rate).
        uac.extend(strings(&["-l", &calls.to_string()]));
        let uac_pid = spawn_sipp_with_stats(procs, d, "uac", &uac);
        // Every INVITE a pending transaction.
        let in_flight = wait_pending(&socket, u64::from(calls), Duration::from_secs(20));
        let sigterm = Instant::now();
        signal(p.pid, "TERM");
        // The proxy acts on the signal within its 20 ms poll; a status
        // query says when it drains.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && ctl_json(&socket, &["status"])["draining"] != true {
            std::thread::sleep(Duration::from_millis(20));
        }
        let invite = ask("INVITE", 5090);
        let options = ask("OPTIONS", 5091);
        let (exit, drained_line) = exit_after_drain(procs, &p, Duration::from_secs(60));
        let exited_after = sigterm.elapsed().as_secs_f64();
        let (_, sipp) = finish_sipp(procs, d, "uac", uac_pid, Duration::from_secs(60));
        (
            in_flight,
            invite,
            options,
            exit,
            exited_after,
            drained_line,
            sipp,
        )
    });
    let (in_flight, invite, options, exit, exited_after, drained_line, sipp) = out;
    eprintln!(
        "drain with {in_flight} calls in flight: exit {exit:?} {exited_after:.2} s after SIGTERM ({drained_line}); SIPp {sipp:?}"
    );
    assert_eq!(in_flight, u64::from(calls), "every call was in flight");
    assert!(
        invite.starts_with("SIP/2.0 503") && invite.contains("\r\nRetry-After:"),
        "a new INVITE while draining: {invite}"
    );
    assert!(
        options.starts_with("SIP/2.0 503"),
        "OPTIONS while draining: {options}"
    );
    assert!(
        exit.is_some_and(|s| s.success()),
        "exit 0 within the drain deadline: {exit:?}"
    );
    assert!(drained_line.contains("drained in"), "{drained_line}");
    assert_eq!(
        (sipp.successful, sipp.failed),
        (u64::from(calls), 0),
        "every call in flight completed"
    );
}

/// The proxies behind the dispatcher in the rolling-restart and reload tests.
const PROXIES: [&str; 3] = ["127.0.0.11:5060", "127.0.0.12:5060", "127.0.0.13:5060"];

/// A stateful proxy on `listen` with its management socket `socket`.
fn proxy_behind(procs: &mut Procs, dir: &Path, listen: &str, socket: &Path) -> ProxyProc {
    start_proxy(
        procs,
        dir,
        &[
            "--listen",
            listen,
            "--relay",
            "127.0.0.0/8",
            "--mode",
            "stateful",
            "--workers",
            "1",
            "--manage-socket",
            socket.to_str().unwrap(),
        ],
    )
}

/// The dispatcher's targets: address → (alive, state, requests).
fn targets(socket: &Path) -> std::collections::BTreeMap<String, (bool, String, u64)> {
    let v = ctl_json(socket, &["targets"]);
    v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["address"].as_str().unwrap().to_string(),
                (
                    t["alive"].as_bool().unwrap(),
                    t["state"].as_str().unwrap().to_string(),
                    t["requests"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Poll (bounded) until `done(targets)`; panics with the last listing.
fn wait_targets(
    socket: &Path,
    what: &str,
    done: impl Fn(&std::collections::BTreeMap<String, (bool, String, u64)>) -> bool,
) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let now = targets(socket);
        if done(&now) {
            return;
        }
        assert!(Instant::now() < end, "{what}: {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A SIPp UAS on 127.0.0.1:5070, then SIPp calls through the dispatcher
/// on 127.0.0.1:5060 at `rate`/s until told to stop
/// ([`stop_dispatched_calls`]), bounded.
fn spawn_dispatched_calls(procs: &mut Procs, dir: &Path, name: &str, rate: u32) -> u32 {
    spawn_sipp(procs, dir, &uas_args("127.0.0.1:5070".parse().unwrap()));
    std::thread::sleep(Duration::from_millis(300));
    spawn_sipp_with_stats(procs, dir, name, &calls_to_bob(rate * 90, rate))
}

/// Stop the calls of [`spawn_dispatched_calls`] (SIGUSR1: no new calls,
/// the current ones end) and wait (bounded) for SIPp's statistics.
fn stop_dispatched_calls(procs: &mut Procs, dir: &Path, name: &str, uac: u32) -> SippStats {
    signal(uac, "USR1");
    finish_sipp(procs, dir, name, uac, Duration::from_secs(60)).1
}

/// Three stateful proxies on [`PROXIES`], each with its management
/// socket (`dir/proxyN.sock`): the sockets and the proxies.
fn three_proxies(procs: &mut Procs, dir: &Path) -> (Vec<PathBuf>, Vec<ProxyProc>) {
    let sockets: Vec<_> = (0..3).map(|i| dir.join(format!("proxy{i}.sock"))).collect();
    let proxies = (0..3)
        .map(|i| proxy_behind(procs, dir, PROXIES[i], &sockets[i]))
        .collect();
    (sockets, proxies)
}

/// Three proxies behind the dispatcher restarted one by one under SIPp
/// load: each is drained at the dispatcher (`ctl target drain`), sent
/// SIGTERM, seen exit 0, started again and enabled; no call fails, and
/// every restarted proxy takes new calls again.
#[test]
fn rolling_restart_of_three_proxies_behind_the_dispatcher_fails_no_call() {
    let out = in_bed(|procs, d| {
        let (sockets, mut proxies) = three_proxies(procs, d);
        let dispatch_socket = d.join("dispatch.sock");
        let mut args = vec!["--listen", "127.0.0.1:5060", "--relay", "127.0.0.0/8"];
        for p in PROXIES {
            args.extend(["--proxy", p]);
        }
        args.extend(["--probe-interval-ms", "100", "--probe-failures", "3"]);
        args.extend(["--manage-socket", dispatch_socket.to_str().unwrap()]);
        let dispatcher = start_dispatcher(procs, d, &args);
        let uac = spawn_dispatched_calls(procs, d, "uac", 40);
        // Every proxy carries calls before the first restart.
        wait_targets(&dispatch_socket, "calls on every proxy", |t| {
            t.values().all(|(_, _, requests)| *requests >= 10)
        });
        let mut exits = Vec::new();
        let started = Instant::now();
        for (i, addr) in PROXIES.into_iter().enumerate() {
            assert_eq!(ctl(&dispatch_socket, &["target", "drain", addr]).0, Some(0));
            signal(proxies[i].pid, "TERM");
            let mut child = procs.take(proxies[i].pid).unwrap();
            exits.push(wait_bounded(&mut child, Duration::from_secs(30)));
            proxies[i] = proxy_behind(procs, d, addr, &sockets[i]);
            let before = targets(&dispatch_socket)[addr].2;
            assert_eq!(
                ctl(&dispatch_socket, &["target", "enable", addr]).0,
                Some(0)
            );
            // Back in: answering probes, active, and taking new calls.
            wait_targets(&dispatch_socket, "restarted proxy back in", |t| {
                let (alive, state, requests) = &t[addr];
                *alive && state == "active" && *requests > before + 5
            });
        }
        let took = started.elapsed().as_secs_f64();
        let calls = stop_dispatched_calls(procs, d, "uac", uac);
        let final_targets = targets(&dispatch_socket);
        stop_proxy(procs, &dispatcher);
        (exits, calls, took, final_targets)
    });
    let (exits, calls, took, final_targets) = out;
    eprintln!(
        "rolling restart of 3 proxies in {took:.1} s under 40 calls/s: {calls:?}; targets {final_targets:?}"
    );
    for exit in &exits {
        assert!(
            exit.is_some_and(|s| s.success()),
            "drained proxy exits 0: {exits:?}"
        );
    }
    assert!(calls.successful > 0, "{calls:?}");
    assert_eq!(
        calls.failed, 0,
        "no call failed across the restarts: {calls:?}"
    );
}

/// The dispatcher's config file: `proxies` behind it.
fn write_dispatch_config(path: &Path, proxies: &[&str], probe_failures: u32) {
    let list: Vec<String> = proxies.iter().map(|p| format!("{p:?}")).collect();
    std::fs::write(
        path,
        format!(
            "[sip.dispatch]\nlisten = \"127.0.0.1:5060\"\nproxy = [{}]\nrelay = \"127.0.0.0/8\"\n\
probe-interval-ms = 100\nprobe-failures = {probe_failures}\n",
            list.join(", ")
        ),
    )
    .unwrap();
}

/// A proxy's transactions created so far (`ringway ctl counters`).
fn transactions_created(socket: &Path) -> u64 {
    ctl_json(socket, &["counters"])["transactions_created"]
        .as_u64()
        .unwrap()
}

/// Ten reloads of the dispatcher (five SIGHUP, five `ringway ctl reload`)
/// during a SIPp run through it to three proxies, the fifth changing a
/// target (A, B → A, C): no call fails, new calls reach C and none
/// reaches B any more; a reload that changes a key needing a restart says
/// so, and an invalid file is refused while the old targets still serve.
#[test]
fn dispatcher_reloads_during_calls_change_a_target() {
    let out = in_bed(|procs, d| {
        let (sockets, _proxies) = three_proxies(procs, d);
        let config = d.join("dispatch.toml");
        write_dispatch_config(&config, &PROXIES[..2], 3);
        let socket = d.join("dispatch.sock");
        let dispatcher = start_dispatcher(
            procs,
            d,
            &[
                "--config",
                config.to_str().unwrap(),
                "--manage-socket",
                socket.to_str().unwrap(),
            ],
        );
        let uac = spawn_dispatched_calls(procs, d, "uac", 20);
        wait_targets(&socket, "calls on A and B", |t| {
            t.values().all(|(_, _, requests)| *requests >= 5)
        });
        let before = targets(&socket);
        let mut reports = Vec::new();
        for i in 0..10 {
            if i == 4 {
                write_dispatch_config(&config, &[PROXIES[0], PROXIES[2]], 3);
            }
            if i == 7 {
                // Needs a restart: reported, not applied.
                write_dispatch_config(&config, &[PROXIES[0], PROXIES[2]], 4);
            }
            if i % 2 == 0 {
                let reloads = ctl_json(&socket, &["status"])["reloads"].as_u64();
                signal(dispatcher.pid, "HUP");
                // Applied when the status counts it (bounded).
                let end = Instant::now() + Duration::from_secs(10);
                while ctl_json(&socket, &["status"])["reloads"].as_u64() == reloads {
                    assert!(Instant::now() < end, "SIGHUP reload not applied");
                    std::thread::sleep(Duration::from_millis(20));
                }
            } else {
                reports.push(ctl_json(&socket, &["reload"]));
            }
            if i == 4 {
                // New calls reach C; then B's last calls are over.
                wait_targets(&socket, "calls reach the new target", |t| {
                    t.len() == 2 && t.get(PROXIES[2]).is_some_and(|c| c.2 >= 20)
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let b_after_change = transactions_created(&sockets[1]);
        // An invalid file: refused, the targets stay.
        std::fs::write(&config, "[sip.dispatch]\nproxy = []\n").unwrap();
        let (refused, _) = ctl(&socket, &["reload"]);
        std::thread::sleep(Duration::from_millis(500));
        let calls = stop_dispatched_calls(procs, d, "uac", uac);
        let after = targets(&socket);
        let status = ctl_json(&socket, &["status"]);
        let b_end = transactions_created(&sockets[1]);
        let c_end = transactions_created(&sockets[2]);
        stop_proxy(procs, &dispatcher);
        (
            before,
            after,
            calls,
            reports,
            refused,
            status,
            (b_after_change, b_end, c_end),
        )
    });
    let (before, after, calls, reports, refused, status, (b_after_change, b_end, c_end)) = out;
    eprintln!(
        "dispatcher reloads: {calls:?}; targets before {before:?} after {after:?}; status {status}; reports {reports:?}"
    );
    assert_eq!(calls.failed, 0, "no call failed across reloads: {calls:?}");
    assert!(calls.successful >= 40, "{calls:?}");
    let listed: Vec<&String> = after.keys().collect();
    assert_eq!(listed, [PROXIES[0], PROXIES[2]], "A and C now");
    assert!(after[PROXIES[2]].2 >= 20, "new calls reach C: {after:?}");
    assert!(c_end > 0, "C's proxy took calls");
    assert_eq!(b_end, b_after_change, "B took no call after the change");
    assert!(before.contains_key(PROXIES[1]) && !before.contains_key(PROXIES[2]));
    assert!(
        reports.iter().any(|r| r["restart_needed"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "probe-failures"))),
        "a key needing a restart is reported: {reports:?}"
    );
    assert_eq!(refused, Some(1), "an invalid file is refused");
    assert_eq!(status["reloads"], 10, "{status}");
    assert_eq!(status["reloads_refused"], 1, "{status}");
}
