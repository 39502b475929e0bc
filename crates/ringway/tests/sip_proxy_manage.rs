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
use std::time::Duration;

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
    let args = strings(&[
        "127.0.0.1:5060",
        "-sf",
        &scenarios().join("register.xml").display().to_string(),
        "-s",
        user,
        "-key",
        "domain",
        "ringway.test",
        "-key",
        "contact",
        contact,
        "-i",
        "127.0.0.1",
        "-p",
        port,
        "-m",
        "1",
        "-timeout",
        "10",
        "-timeout_error",
    ]);
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
    let (listed, human, removed, after, before_call, after_call, sipsak_ok) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("manage.sock");
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &[
                "--listen",
                "127.0.0.1:5060",
                "--relay",
                "127.0.0.0/8",
                "--mode",
                "stateful",
                "--registrar",
                "--domain",
                "ringway.test",
                "--manage-socket",
                socket.to_str().unwrap(),
            ],
        );
        spawn_sipp(
            &mut procs,
            dir.path(),
            &uas_args("127.0.0.1:5070".parse().unwrap()),
        );
        let bob = register(&mut procs, dir.path(), "bob", "127.0.0.1:5070", "5066");
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
        let before_call = call(&mut procs, dir.path(), "call-before", "bob", 5061);
        let removed = ctl_json(&socket, &["unbind", "bob@ringway.test"]);
        let after = ctl_json(&socket, &["bindings"]);
        let after_call = call(&mut procs, dir.path(), "call-after", "bob", 5062);
        // Removing it again: 404, exit code 1.
        let (again, _) = ctl(&socket, &["unbind", "bob@ringway.test"]);
        assert_eq!(again, Some(1), "a second unbind finds nothing");
        stop_proxy(&mut procs, &p);
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
