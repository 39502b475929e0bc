//! Structured logs (issue 22): a proxy with `log-format = "json"` and
//! every level on (`trace`) in its config file, digest credentials, a
//! Redis location store behind a password and a management token, driven
//! through registrations with wrong and right passwords, reloads (SIGHUP,
//! `ringway ctl reload`, one refused), a log-level change at run time and
//! a drain: every stderr line is one JSON object with `ts`, `level`,
//! `target` and `msg`, and no secret of the configuration (a password, an
//! HA1, the Redis password, the management token) appears in any line.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const REALM: &str = "ringway.test";
const ALICE_PASSWORD: &str = "Tr0ub4dor-alice-pw";
const REDIS_PASSWORD: &str = "redis-pw-9f3c1e77d2";
const TOKEN: &str = "manage-token-6b8e0d4a51c2";

fn config(path: &Path, users: &Path, location: &str) {
    std::fs::write(
        path,
        format!(
            r#"[sip.proxy]
listen = "127.0.0.1:5060"
mode = "stateful"
registrar = true
domain = ["{REALM}"]
relay = "127.0.0.0/8"
auth = true
auth-file = "{}"
auth-realm = "{REALM}"
auth-algorithm = ["md5", "sha-256"]
location = "{location}"
log-format = "json"
log-level = "trace"
"#,
            users.display()
        ),
    )
    .unwrap();
}

fn register(procs: &mut Procs, dir: &Path, name: &str, password: &str, port: &str) -> SippStats {
    let args = register_sipp("register_auth.xml", "alice", "127.0.0.1:5070", port)
        .digest("alice", password, REALM)
        .timeout(10)
        .build();
    run_sipp(procs, dir, name, &args, Duration::from_secs(20)).1
}

fn ctl(socket: &Path, args: &[&str]) -> Option<i32> {
    Command::new(ringway())
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("run ringway ctl")
        .code()
}

#[test]
fn json_logs_parse_and_carry_no_secret() {
    let md5 = ringway_sip::auth::Algorithm::Md5
        .ha1("alice", REALM, ALICE_PASSWORD)
        .to_string();
    let sha = ringway_sip::auth::Algorithm::Sha256
        .ha1("alice", REALM, ALICE_PASSWORD)
        .to_string();
    let secrets = [
        ALICE_PASSWORD.to_string(),
        REDIS_PASSWORD.to_string(),
        TOKEN.to_string(),
        md5.clone(),
        sha.clone(),
    ];
    let (lines, wrong, right, reload_codes, exit) = netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let redis = Command::new("redis-server")
            .args(["--port", "6379", "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--requirepass", REDIS_PASSWORD])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (Debian package redis-server)");
        procs.add("redis", redis);
        let end = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect("127.0.0.1:6379").is_err() {
            assert!(Instant::now() < end, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        let users = dir.path().join("users.htdigest");
        std::fs::write(
            &users,
            format!("alice:{REALM}:{md5}\nalice:{REALM}:{sha}\n"),
        )
        .unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let socket = dir.path().join("manage.sock");
        let toml = dir.path().join("ringway.toml");
        let location = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:6379/0");
        config(&toml, &users, &location);
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &[
                "--config",
                toml.to_str().unwrap(),
                "--manage-socket",
                socket.to_str().unwrap(),
                "--manage-http",
                "127.0.0.1:9190",
                "--manage-token-file",
                token_file.to_str().unwrap(),
            ],
        );
        let wrong = register(&mut procs, dir.path(), "wrong", "not-the-password", "5066");
        let right = register(&mut procs, dir.path(), "right", ALICE_PASSWORD, "5067");
        signal(p.pid, "HUP");
        let mut codes = vec![ctl(&socket, &["reload"])];
        // Refused: a store URL with the password and a bad database.
        config(
            &toml,
            &users,
            &format!("redis://:{REDIS_PASSWORD}@127.0.0.1:6379/x"),
        );
        codes.push(ctl(&socket, &["reload"]));
        config(&toml, &users, &location);
        codes.push(ctl(&socket, &["log-level", "debug,ringway_server=trace"]));
        codes.push(ctl(&socket, &["reload"]));
        // Drain and exit (the drain's lines too).
        signal(p.pid, "TERM");
        let mut child = procs.take(p.pid).unwrap();
        let exit = wait_bounded(&mut child, Duration::from_secs(30));
        let mut lines = p.startup.clone();
        // The reader thread ends at EOF: everything is in the channel.
        let end = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = p
            .stderr
            .recv_timeout(end.saturating_duration_since(Instant::now()))
        {
            lines.push(line);
        }
        (lines, wrong, right, codes, exit)
    });
    assert_eq!(
        (wrong.successful, wrong.failed),
        (0, 1),
        "wrong password refused"
    );
    assert_eq!(
        (right.successful, right.failed),
        (1, 0),
        "right password registers"
    );
    assert_eq!(reload_codes, [Some(0), Some(1), Some(0), Some(0)]);
    assert!(exit.is_some_and(|s| s.success()), "drained: {exit:?}");
    assert!(lines.len() >= 8, "{lines:#?}");
    for line in &lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for key in ["ts", "level", "target", "msg"] {
            assert!(value[key].is_string(), "no {key}: {line}");
        }
        for secret in &secrets {
            assert!(
                !line.contains(secret.as_str()),
                "a secret in the log: {line}"
            );
        }
    }
    let messages: Vec<&str> = lines.iter().map(String::as_str).collect();
    let has = |what: &str| messages.iter().any(|l| l.contains(what));
    assert!(has("reload refused"), "the refused reload is logged");
    assert!(has("log level set to debug,ringway_server=trace"));
    assert!(has("drained in"));
}
