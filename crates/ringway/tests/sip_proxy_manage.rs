//! Operating a running `ringway sip proxy` (issue 22), in a private
//! network namespace: `ringway ctl` lists and deletes a binding (the
//! deleted AOR is no longer reachable); SIGTERM drains with calls in
//! flight (they complete, new ones get 503, exit 0); SIGHUP and
//! `ringway ctl reload` re-read the config and the credentials during a
//! SIPp run with no failed call, and an invalid config is refused.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::path::Path;
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

/// Register `user@ringway.test` → `sip:user@contact` with SIPp (register.xml).
fn register(procs: &mut Procs, dir: &Path, user: &str, contact: &str, port: &str) -> SippStats {
    let args = register_sipp("register.xml", user, contact, port)
        .timeout(10)
        .build();
    run_sipp(
        procs,
        dir,
        &format!("reg-{user}"),
        &args,
        Duration::from_secs(20),
    )
    .1
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
            let bob = register(procs, dir, "bob", "127.0.0.1:5070", "5066");
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
            let p = start_loopback_proxy(
                procs,
                dir,
                &[
                    "--mode",
                    "stateful",
                    "--manage-socket",
                    socket.to_str().unwrap(),
                    "--drain-timeout",
                    "20",
                ],
            );
            let slow = std::fs::read_to_string(scenarios().join("uas_rr.xml"))
                .unwrap()
                .replace(
                    r#"<pause milliseconds="20"/>"#,
                    r#"<pause milliseconds="1500"/>"#,
                );
            let slow_path = dir.join("uas_slow.xml");
            std::fs::write(&slow_path, slow).unwrap();
            let mut uas = uas_args("127.0.0.1:5070".parse().unwrap());
            uas[1] = slow_path.display().to_string();
            spawn_sipp(procs, dir, &uas);
            let uac = uac_args(
                "127.0.0.1:5060".parse().unwrap(),
                "127.0.0.1:5061".parse().unwrap(),
                "bob",
                "127.0.0.1:5070",
                calls,
                rate,
            );
            let uac_pid = spawn_sipp_with_stats(procs, dir, "uac", &uac);
            // Half the calls are ringing: drain.
            let until = Instant::now() + Duration::from_secs(10);
            let mut in_flight = 0;
            while Instant::now() < until {
                let status = ctl_json(&socket, &["status"]);
                in_flight = status["transactions_pending"].as_u64().unwrap();
                if in_flight >= u64::from(calls / 4) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
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
            let mut child = procs.take(p.pid).unwrap();
            let exit = wait_bounded(&mut child, Duration::from_secs(30));
            let drained_line = p
                .stderr
                .try_iter()
                .find(|l| l.contains("drained in"))
                .unwrap_or_default();
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
    let args = register_sipp("register_auth.xml", user, "127.0.0.1:5070", port)
        .digest(user, password, "ringway.test")
        .timeout(10)
        .build();
    run_sipp(procs, dir, name, &args, Duration::from_secs(20)).1
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
