//! `--config`: the proxy starts from the documented sample
//! (docs/ringway.toml) and serves what it says, the command line overrides
//! it, `ringway config check` accepts it, the SFU reads its own table, and
//! a bad file stops start-up with one line naming file, line and key.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ringway.toml")
}

#[test]
fn proxy_starts_from_the_sample_and_registers_with_its_users() {
    let (summary, reg) = in_bed(|procs, dir| {
        let sample = sample().display().to_string();
        // The command line overrides the file: SIPp answers only MD5 and
        // only the first challenge.
        let proxy = start_proxy(
            procs,
            dir,
            &[
                "--config",
                &sample,
                "--auth-algorithm",
                "md5",
                // Every UA of this test bed is on loopback (docs/security.md).
                "--relay",
                "127.0.0.0/8",
            ],
        );
        let args = register_sipp("register_auth.xml", "alice", "127.0.0.1:5070", "5062")
            .digest("alice", "secret", "ringway.test")
            .timeout(10)
            .build();
        let (st, reg) = run_sipp(procs, dir, "register", &args, Duration::from_secs(20));
        assert!(st.is_some_and(|s| s.success()), "REGISTER: {reg:?}");
        (stop_proxy(procs, &proxy), reg)
    });
    assert_eq!((reg.successful, reg.failed), (1, 0));
    let config = &summary["config"];
    assert_eq!(config["listen"], "127.0.0.1:5060");
    assert_eq!(config["mode"], "stateful");
    assert_eq!(config["registrar"], true);
    assert_eq!(config["domains"][0], "ringway.test");
    assert_eq!(config["auth"], true);
    assert_eq!(config["auth_algorithms"], serde_json::json!(["MD5"]));
    assert_eq!(config["flood_limit"], 200);
    assert_eq!(summary["proxy"]["bindings"], 1);
}

#[test]
fn config_check_sfu_config_and_one_line_errors() {
    let check = Command::new(ringway())
        .args(["config", "check"])
        .arg(sample())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        stdout.contains("ok ([sfu.serve]") && stdout.contains("[sip.proxy]"),
        "{stdout}"
    );

    // The SFU starts from its table of the sample (and stops by itself).
    let sfu = netns(|| {
        let mut child = Command::new(ringway())
            .args(["sfu", "serve", "--config"])
            .arg(sample())
            .args(["--duration", "1", "--stats-interval", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let status = wait_bounded(&mut child, Duration::from_secs(15));
        let mut text = String::new();
        std::io::Read::read_to_string(&mut out, &mut text).unwrap();
        (status.is_some_and(|s| s.success()), text)
    });
    assert!(sfu.0, "{}", sfu.1);
    assert!(sfu.1.contains("listening on 127.0.0.1:5004"), "{}", sfu.1);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    for (text, want) in [
        (
            "[sip.proxy]\nlisten = \"127.0.0.1:0\"\nworkerz = 2\n",
            "bad.toml:3: [sip.proxy] unknown key `workerz`",
        ),
        (
            "[sip.proxy]\nmode = \"statefull\"\n",
            "bad.toml:2: [sip.proxy] mode: invalid value 'statefull'",
        ),
        (
            "[sip.proxy]\nlisten = \"0.0.0.0:5060\"\n",
            "bad.toml:2: [sip.proxy] listen: invalid configuration",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let out = Command::new(ringway())
            .args(["sip", "proxy", "--config"])
            .arg(&bad)
            .args(["--duration", "1", "--quiet"])
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(want), "{text:?}: {stderr}");
    }
}
