//! Rooms, signed join tokens, the admin API and the SFU's `/metrics`,
//! against a real `ringway sfu serve` process and real UDP peers
//! (loopback only).
//!
//! Each check was seen failing once against a core without it (see
//! docs/sfu.md, "Tests").

mod sfu_common;

use ringway_sfu::client::Reply;
use ringway_sfu::token::{mint, Claims, TokenKey};
use ringway_sfu::wire::{ErrorCode, COOKIE_LEN};
use ringway_sfu::MediaType;
use sfu_common::{admin_http, assert_promtool_accepts, rtp_ids, Peer, Server, BIN};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// The test's key files and server.
struct Setup {
    server: Server,
    admin: SocketAddr,
    key_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn start(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("sfu.key");
    std::fs::write(&key_file, "0123456789abcdef0123456789abcdef-test-key\n").unwrap();
    let admin_file = dir.path().join("admin.token");
    std::fs::write(&admin_file, format!("{ADMIN_TOKEN}\n")).unwrap();
    let mut args = vec![
        "--token-key-file",
        key_file.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--admin-token-file",
        admin_file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let server = Server::start("socket", &args);
    let admin = server
        .line
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("http://"))
        .find_map(|w| w.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no admin address in {:?}", server.line));
    Setup {
        server,
        admin,
        key_file,
        _dir: dir,
    }
}

/// `ringway sfu token ...` with the key file; the token.
fn cli_token(key: &Path, room: &str, who: &str, extra: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["sfu", "token", "--key-file", key.to_str().unwrap()])
        .args(["--room", room, "--identity", who])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(!t.contains("test-key"), "the key leaked into the token");
    t
}

/// One HTTP exchange with the admin API: (status, body).
fn http(admin: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    admin_http(admin, method, path, token)
}

fn api(admin: SocketAddr, method: &str, path: &str) -> serde_json::Value {
    let (status, body) = http(admin, method, path, Some(ADMIN_TOKEN));
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {body}"
    );
    serde_json::from_str(&body).unwrap()
}

/// REGISTER (version 2) for `room` with `token`: the final reply.
fn join(p: &mut Peer, room: &str, token: &str) -> Reply {
    let (id, m) = p
        .reqs
        .register_v2(&[0; COOKIE_LEN], room, token.as_bytes())
        .unwrap();
    match p.request(id, &m) {
        Reply::Challenge(_, cookie) => {
            let (id, m) = p.reqs.register_v2(&cookie, room, token.as_bytes()).unwrap();
            let r = p.request(id, &m);
            if let Reply::Ack(_, s) = r {
                p.session = Some(s);
            }
            r
        }
        r => panic!("a first REGISTER must earn a CHALLENGE: {r:?}"),
    }
}

fn refused(r: Reply) -> bool {
    matches!(r, Reply::Error(_, Some(ErrorCode::Unauthorized), _))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Media from `from` (SSRC = its SSID) reaching `to`: how many of 5 packets.
fn media_through(from: &Peer, to: &Peer) -> usize {
    let ssid = from.session.unwrap().ssid;
    for q in 0..5 {
        from.send_rtp(ssid, MediaType::Asq, q);
    }
    rtp_ids(&to.drain(Duration::from_millis(300)))
        .iter()
        .filter(|(s, _, _)| *s == ssid)
        .count()
}

#[test]
fn tokens_forged_expired_wrong_room_and_replay_after_kick() {
    let s = start(&[]);
    let addr = s.server.addr;
    let key = TokenKey::from_file_contents(std::fs::read(&s.key_file).unwrap()).unwrap();
    let alice_token = cli_token(&s.key_file, "jam", "alice", &[]);
    let bob_token = cli_token(&s.key_file, "jam", "bob", &["--ttl", "600"]);

    let mut mallory = Peer::new(addr);
    // No token, a forged one (another key), an expired one, one for another room.
    assert!(refused(join(&mut mallory, "jam", "")), "no token");
    let other = TokenKey::new(b"another-key-another-key-another-key".to_vec()).unwrap();
    let claims = |room: &str, exp: u64| Claims {
        room: room.into(),
        sub: "mallory".into(),
        exp,
        nbf: None,
        iat: None,
        publish: true,
        subscribe: true,
    };
    assert!(
        refused(join(
            &mut mallory,
            "jam",
            &mint(&other, &claims("jam", unix_now() + 60))
        )),
        "forged"
    );
    assert!(
        refused(join(
            &mut mallory,
            "jam",
            &mint(&key, &claims("jam", unix_now() - 5))
        )),
        "expired"
    );
    assert!(
        refused(join(
            &mut mallory,
            "jam",
            &cli_token(&s.key_file, "other", "m", &[])
        )),
        "wrong room"
    );
    // A version-1 REGISTER carries no token.
    assert!(refused(mallory.register_reply()), "v1 without token");

    let mut alice = Peer::new(addr);
    let mut bob = Peer::new(addr);
    assert!(matches!(
        join(&mut alice, "jam", &alice_token),
        Reply::Ack(..)
    ));
    assert!(matches!(join(&mut bob, "jam", &bob_token), Reply::Ack(..)));
    assert!(matches!(bob.subscribe("all", false), Reply::Ack(..)));
    assert_eq!(media_through(&alice, &bob), 5);

    // The admin API lists them with their identities.
    let rooms = api(s.admin, "GET", "/api/rooms");
    let clients = &rooms["rooms"][0]["clients"];
    let names: Vec<&str> = clients
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["identity"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice", "bob"]);
    assert_eq!(clients[0]["streams"][0]["packets"], 5);

    // Kick alice: her media stops reaching bob, and her token is dead.
    let alice_ssid = alice.session.unwrap().ssid;
    api(s.admin, "DELETE", &format!("/api/clients/{alice_ssid}"));
    assert_eq!(media_through(&alice, &bob), 0, "media after the kick");
    assert!(
        refused(join(&mut alice, "jam", &alice_token)),
        "replay after kick"
    );
    let mut elsewhere = Peer::new(addr);
    assert!(
        refused(join(&mut elsewhere, "jam", &alice_token)),
        "replay from another port"
    );

    std::thread::sleep(Duration::from_millis(200)); // counters are published every 50 ms
    let stats = api(s.admin, "GET", "/api/stats");
    let sfu = &stats["sfu"];
    assert_eq!(sfu["token_missing"], 2);
    assert_eq!(sfu["token_forged"], 1);
    assert_eq!(sfu["token_expired"], 1);
    assert_eq!(sfu["token_wrong_room"], 1);
    assert_eq!(sfu["token_revoked"], 2);
    assert_eq!(sfu["kicks"], 1);
    // Without the bearer token the API refuses; with a wrong one too.
    assert_eq!(http(s.admin, "GET", "/api/rooms", None).0, 401);
    assert_eq!(
        http(s.admin, "GET", "/api/rooms", Some("admin-token-0123456788")).0,
        401
    );
    let report = s.server.stop();
    assert_eq!(report["sfu"]["kicks"], 1);
}

/// A client whose NAT rebinds (new source port) proves the new address
/// (cookie) and its session token; then its media flows from and to the
/// new port. Another address with the SSID but not the token moves nothing.
#[test]
fn nat_rebinding_is_reverified() {
    let s = start(&[]);
    let addr = s.server.addr;
    let mut alice = Peer::new(addr);
    let mut bob = Peer::new(addr);
    assert!(matches!(
        join(
            &mut alice,
            "jam",
            &cli_token(&s.key_file, "jam", "alice", &[])
        ),
        Reply::Ack(..)
    ));
    assert!(matches!(
        join(&mut bob, "jam", &cli_token(&s.key_file, "jam", "bob", &[])),
        Reply::Ack(..)
    ));
    assert!(matches!(alice.subscribe("all", false), Reply::Ack(..)));
    assert!(matches!(bob.subscribe("all", false), Reply::Ack(..)));
    let session = alice.session.unwrap();
    // Alice's NAT picks a new port.
    let mut moved = Peer::new(addr);
    moved.session = Some(session);
    assert_eq!(media_through(&moved, &bob), 0, "unverified before REBIND");
    // An attacker who knows the SSID but not the token.
    let attacker = Peer::new(addr);
    let (id, m) = attacker.reqs.clone().rebind(
        &[0; COOKIE_LEN],
        ringway_sfu::client::Session {
            token: 1,
            ..session
        },
    );
    let Reply::Challenge(_, c) = attacker.request(id, &m) else {
        panic!()
    };
    let (id, m) = attacker.reqs.clone().rebind(
        &c,
        ringway_sfu::client::Session {
            token: 1,
            ..session
        },
    );
    assert!(matches!(
        attacker.request(id, &m),
        Reply::Error(_, Some(ErrorCode::BadToken), _)
    ));
    // The real client.
    let (id, m) = moved.reqs.rebind(&[0; COOKIE_LEN], session);
    let Reply::Challenge(_, c) = moved.request(id, &m) else {
        panic!()
    };
    let (id, m) = moved.reqs.rebind(&c, session);
    assert!(matches!(moved.request(id, &m), Reply::Ack(..)));
    assert_eq!(media_through(&moved, &bob), 5);
    assert_eq!(
        media_through(&bob, &moved),
        5,
        "routes follow the new address"
    );
    assert_eq!(media_through(&bob, &alice), 0, "nothing to the old port");
    let report = s.server.stop();
    assert_eq!(report["sfu"]["rebinds"], 1);
}

/// The SFU's `/metrics` passes `promtool check metrics`, with rooms,
/// clients, drops and token refusals populated.
#[test]
fn sfu_metrics_pass_promtool() {
    let s = start(&[]);
    let addr = s.server.addr;
    let mut a = Peer::new(addr);
    let mut b = Peer::new(addr);
    assert!(matches!(
        join(&mut a, "jam", &cli_token(&s.key_file, "jam", "a", &[])),
        Reply::Ack(..)
    ));
    assert!(matches!(
        join(
            &mut b,
            "rehearsal",
            &cli_token(&s.key_file, "rehearsal", "b", &[])
        ),
        Reply::Ack(..)
    ));
    let mut m = Peer::new(addr);
    assert!(refused(join(&mut m, "jam", "not.a.token")));
    for q in 0..10 {
        a.send_rtp(a.session.unwrap().ssid, MediaType::Asq, q);
    }
    m.sock.send_to(b"garbage", addr).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // one tick publishes the counters
    let (status, text) = http(s.admin, "GET", "/metrics", None);
    assert_eq!(status, 200);
    for want in [
        "ringway_sfu_rooms 2",
        "ringway_sfu_clients 2",
        "ringway_sfu_room_clients{room=\"jam\"} 1",
        "ringway_sfu_token_refused_total{reason=\"malformed\"} 1",
        "ringway_sfu_drops_total{reason=\"malformed\"} 1",
        "ringway_sfu_media_packets_total 10",
        "ringway_sfu_io_rx_packets_total{backend=\"socket\"}",
        "ringway_sfu_engine_cpu_seconds_total",
        "ringway_sfu_engine_cpu_per_datagram_seconds",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert_promtool_accepts(&text);
    // Rooms through the API: create (pinned), close (kicks its client).
    api(s.admin, "POST", "/api/rooms/stage?max_clients=2");
    assert_eq!(
        http(s.admin, "POST", "/api/rooms/stage", Some(ADMIN_TOKEN)).0,
        409
    );
    let closed = api(s.admin, "DELETE", "/api/rooms/rehearsal");
    assert_eq!(closed["kicked"], 1);
    let rooms = api(s.admin, "GET", "/api/rooms");
    let names: Vec<&str> = rooms["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["jam", "stage"]);
    s.server.stop();
}
