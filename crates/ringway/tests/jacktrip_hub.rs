//! Real JackTrip 1.7 hub clients (`jacktrip -C`, each on its own `jackd -d
//! dummy` server) through `ringway sfu jacktrip`, in a private network
//! namespace: a sine played into one client (jack_metro) is recorded at
//! the others (jack_rec) and its frequency and level are measured
//! (Goertzel). The three-client session also sets a gain and reads the
//! clients' counters through the hub's admin API, and checks its
//! `/metrics` with promtool; the two-client one runs the hub `--clocked`.
//! Needs the Debian packages jacktrip, jackd2, sox and prometheus.

mod sfu_common;

use sfu_common::{admin_http, assert_promtool_accepts, in_netns, BIN};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Child processes, killed by PID (SIGTERM, then SIGKILL) on drop.
#[derive(Default)]
struct Procs(Vec<Child>);

impl Procs {
    fn spawn(&mut self, c: &mut Command, log: &Path) {
        let f = std::fs::File::create(log).unwrap();
        let child = c
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
        self.0.push(child);
    }
}

impl Drop for Procs {
    /// SIGTERM to all, up to 5 s for them to end (a jackd killed before it
    /// cleans up leaves its semaphores and shared memory in /dev/shm), then
    /// SIGKILL to what is left.
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        wait_until(5, || {
            self.0
                .iter_mut()
                .all(|c| c.try_wait().ok().flatten().is_some())
        });
        for c in self.0.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// JACK's server registry (/dev/shm/jack-shm-registry, 8 entries) keeps the
/// entries of servers that were killed; servers of other names cannot reuse
/// them ("Too many servers already active"). When no jackd runs on this
/// machine every entry is stale, and the registry is removed.
fn clear_stale_jack_registry() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let running = Command::new("pgrep")
            .args(["-x", "jackd"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !running {
            remove_jack_shm(|name| name.starts_with("jack"));
        }
    });
}

/// The last 15 lines of each of `logs` in `dir`, headed by their names.
fn log_tails(dir: &Path, logs: &[&str]) -> String {
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        out += &format!("--- {log} (last lines)\n");
        for line in tail.iter().rev() {
            out += line;
            out.push('\n');
        }
    }
    out
}

/// Remove the JACK files in /dev/shm whose names `stale` picks.
fn remove_jack_shm(stale: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(&stale) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Polls `ready` every 100 ms until it holds or `secs` pass (a loaded
/// machine starts jackd and the clients slowly; fixed sleeps made this flaky).
fn wait_until(secs: u64, mut ready: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ready()
}

/// Whether the JACK server `server` lists a port named `port`.
fn has_port(server: &str, port: &str) -> bool {
    // A JACK client can hang when its server stalls: never wait for one
    // longer than 5 s (`timeout`, coreutils).
    jack(server, &["timeout", "-k", "1", "5", "jack_lsp"])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == port)
        })
}

fn jack(server: &str, args: &[&str]) -> Command {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .env("JACK_DEFAULT_SERVER", server)
        .env("JACK_NO_START_SERVER", "1");
    c
}

/// Largest level at which a tone counts as absent: dropouts of the other
/// tone under load (a late packet played as silence) leak about 0.01 into
/// every frequency in the worst 50 ms window; a tone sent back to its sender
/// or mixed where it does not belong arrives at 0.15–0.5.
const ABSENT: f64 = 0.05;

/// The sine amplitude at `freq` Hz in `samples` (48 kHz): the largest
/// Goertzel estimate over 50 ms windows.
fn tone_level(samples: &[f32], freq: f64) -> f64 {
    let n = 2400;
    samples
        .chunks_exact(n)
        .map(|w| {
            let k = 2.0 * (2.0 * std::f64::consts::PI * freq / 48_000.0).cos();
            let (mut s1, mut s2) = (0.0f64, 0.0f64);
            for &x in w {
                let s0 = f64::from(x) + k * s1 - s2;
                s2 = s1;
                s1 = s0;
            }
            let power = s1 * s1 + s2 * s2 - k * s1 * s2;
            2.0 * power.max(0.0).sqrt() / n as f64
        })
        .fold(0.0, f64::max)
}

/// A recorded WAV as f32 samples (through sox).
fn read_wav(p: &Path) -> Vec<f32> {
    let out = Command::new("sox")
        .arg(p)
        .args(["-t", "f32", "-c", "1", "-"])
        .output()
        .expect("sox (Debian package sox)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Start the hub and `n` JackTrip clients; client i (0-based) plays the
/// tone `tones[i]` (Hz, amplitude) if given; every client records 3 s of
/// what it receives. Returns the recordings and the hub's JSON report.
const ADMIN: &str = "127.0.0.1:4480";
const ADMIN_TOKEN: &str = "jacktrip-admin-token-0123";

/// One request to the hub's admin API: status and body.
fn http(method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    admin_http(ADMIN.parse().unwrap(), method, path, token)
}

/// How a session runs the hub, and what it does through its admin API
/// once the tones play.
#[derive(Default, Clone)]
struct HubSetup {
    /// `--clocked`.
    clocked: bool,
    /// (client index, gain) set through the admin API.
    gains: Vec<(usize, f32)>,
}

/// The session's results: what each client recorded, the hub's report
/// and (with gains set) the admin API's client list.
struct SessionResult {
    audio: Vec<Vec<f32>>,
    report: serde_json::Value,
    clients: serde_json::Value,
    /// A JACK server stalled during the recording (a jack_rec hung or failed
    /// to open and was run again): the recordings may hold silence that is
    /// the test machine's, not the hub's.
    disturbed: bool,
}

/// How many times a disturbed session runs at most.
const ATTEMPTS: usize = 4;

/// A session, run again (up to three times, with the same JACK server names) when
/// a JACK server stalled while recording. CI saw a stalled first recording
/// followed by a retried one that heard silence on a loaded machine; a hub
/// that does not forward records silence in undisturbed runs too, so the
/// checks still fail on it.
///
/// A session that fails while setting up (a JACK server or a JackTrip client
/// did not come up in time, a recording is missing) runs again too; the last
/// attempt's failure is the test's.
///
/// The two tests' sessions run one at a time: five JACK servers and their
/// clients at once missed cycles on a loaded 2-vCPU machine.
fn steady_session(n: usize, tones: &[Option<(u32, f32)>], setup: &HubSetup) -> SessionResult {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let run = || session(n, tones.to_vec(), setup.clone());
        let r = if attempt == ATTEMPTS {
            run()
        } else {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                Ok(r) => r,
                Err(_) => {
                    eprintln!("session {attempt} failed while setting up: running it again");
                    continue;
                }
            }
        };
        if !r.disturbed || attempt == ATTEMPTS {
            return r;
        }
        eprintln!("session {attempt} disturbed by a stalled JACK server: running it again");
    }
}

fn session(n: usize, tones: Vec<Option<(u32, f32)>>, setup: HubSetup) -> SessionResult {
    // JACK servers share /dev/shm across network namespaces and its registry
    // holds at most 8 of them; an entry whose server died is reused only by a
    // server of the same name. So the names are fixed (not per process), and
    // each session (the tests run in parallel) has its own.
    // The two tests differ in `n`, so it names the session's servers.
    clear_stale_jack_registry();
    let tag = format!("rwjt{n}");
    // This session's servers are gone (an earlier session's `Procs` waited
    // for them): semaphores of their names left by a killed server would
    // be taken over by the new ones.
    let prefix = format!("_{tag}-");
    remove_jack_shm(|name| name.starts_with("jack_sem.") && name.contains(&prefix));
    in_netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let mut procs = Procs::default();
        let json = d.join("hub.json");
        let token_file = d.join("admin.token");
        std::fs::write(&token_file, ADMIN_TOKEN).unwrap();
        let mut hub = Command::new(BIN);
        hub.args([
            "sfu",
            "jacktrip",
            "--listen",
            "127.0.0.1:4464",
            "--udp-port",
            "61002",
            // A cap only (the test stops the hub with SIGTERM): long enough
            // that jack_rec retries after a hung first attempt still hear
            // the hub (CI once saw all three retried clients record silence
            // after a 20 s cap had run out).
            "--duration",
            "120",
            "--admin",
            ADMIN,
            "--admin-token-file",
            token_file.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ]);
        if setup.clocked {
            hub.arg("--clocked");
        }
        procs.spawn(&mut hub, &d.join("hub.log"));
        // 512-frame periods (10.7 ms) and no real-time scheduling: at 128
        // frames five servers and their clients wake 375 times a second each,
        // and a loaded machine made them miss cycles until JACK refused new
        // clients ("Cannot open jackrec client") and dropped a JackTrip
        // client whose notification failed, so a recording was silence (CI,
        // reproduced here at 128 frames under two busy loops). Real-time
        // servers failed the same way at 512 frames under the busy loops (their
        // request threads starve behind the real-time ones); `--no-realtime`
        // at 512 frames passed 9 runs of 9 under them.
        for i in 0..n {
            let name = format!("{tag}-{i}");
            procs.spawn(
                &mut jack(
                    &name,
                    &[
                        "jackd",
                        "--no-realtime",
                        "-n",
                        &name,
                        "-d",
                        "dummy",
                        "-r",
                        "48000",
                        "-p",
                        "512",
                    ],
                ),
                &d.join(format!("jackd{i}.log")),
            );
        }
        for i in 0..n {
            let name = format!("{tag}-{i}");
            assert!(
                wait_until(20, || has_port(&name, "system:playback_1")),
                "jackd {i} did not start: {}",
                std::fs::read_to_string(d.join(format!("jackd{i}.log"))).unwrap_or_default()
            );
        }
        for i in 0..n {
            let name = format!("{tag}-{i}");
            let bind = (5001 + i).to_string();
            procs.spawn(
                &mut jack(
                    &name,
                    &[
                        "jacktrip",
                        "-C",
                        "127.0.0.1",
                        "-B",
                        &bind,
                        "-n",
                        "1",
                        "-J",
                        &format!("c{i}"),
                        "-D",
                    ],
                ),
                &d.join(format!("jacktrip{i}.log")),
            );
        }
        for i in 0..n {
            let name = format!("{tag}-{i}");
            let port = format!("c{i}:send_1");
            assert!(
                wait_until(20, || has_port(&name, &port)),
                "jacktrip client {i} did not register {port}\n{}",
                log_tails(
                    &d,
                    &[
                        &format!("jacktrip{i}.log"),
                        &format!("jackd{i}.log"),
                        "hub.log"
                    ]
                )
            );
        }
        // Give the hub time to latch every client's first audio packet.
        std::thread::sleep(Duration::from_secs(1));
        for (i, t) in tones.iter().enumerate() {
            let Some((f, a)) = t else { continue };
            let name = format!("{tag}-{i}");
            procs.spawn(
                &mut jack(
                    &name,
                    &[
                        "jack_metro",
                        "-f",
                        &f.to_string(),
                        "-A",
                        &a.to_string(),
                        "-b",
                        "60",
                        "-D",
                        "900",
                        "-a",
                        "1",
                        "-d",
                        "1",
                        "-n",
                        "metro",
                    ],
                ),
                &d.join(format!("metro{i}.log")),
            );
            let ok = wait_until(20, || {
                jack(
                    &name,
                    &[
                        "timeout",
                        "-k",
                        "1",
                        "5",
                        "jack_connect",
                        "metro:60_bpm",
                        &format!("c{i}:send_1"),
                    ],
                )
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            });
            assert!(ok, "jack_connect on client {i}");
        }
        let clients = if setup.gains.is_empty() {
            serde_json::Value::Null
        } else {
            admin_gains(n, &setup.gains)
        };
        let recs: Vec<PathBuf> = (0..n).map(|i| d.join(format!("rec{i}.wav"))).collect();
        let record = |i: usize| -> Child {
            let name = format!("{tag}-{i}");
            jack(
                &name,
                &[
                    "jack_rec",
                    "-f",
                    recs[i].to_str().unwrap(),
                    "-d",
                    "3",
                    &format!("c{i}:receive_1"),
                ],
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join(format!("rec{i}.log"))).unwrap())
            .spawn()
            .unwrap()
        };
        // jack_rec can hang when its server stalls: never wait for it
        // longer than its 3 s recording plus a margin.
        // Whether it ended by itself.
        let finish = |mut r: Child| -> bool {
            let end = std::time::Instant::now() + Duration::from_secs(20);
            while std::time::Instant::now() < end {
                if r.try_wait().ok().flatten().is_some() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = r.kill();
            let _ = r.wait();
            false
        };
        let recorders: Vec<Child> = (0..n).map(record).collect();
        let mut disturbed = false;
        for r in recorders {
            disturbed |= !finish(r);
        }
        // jack_rec sometimes fails to open its client while the machine is
        // loaded ("Cannot open jackrec client"): record that client again.
        for attempt in 0..3 {
            let missing: Vec<usize> = (0..n).filter(|&i| !recs[i].exists()).collect();
            if missing.is_empty() {
                break;
            }
            eprintln!("jack_rec retry {attempt} for clients {missing:?}");
            for &i in &missing {
                eprintln!(
                    "{}",
                    log_tails(&d, &[&format!("rec{i}.log"), &format!("jackd{i}.log")])
                );
            }
            disturbed = true;
            for i in missing {
                finish(record(i));
            }
        }
        for (i, p) in recs.iter().enumerate() {
            if !p.exists() {
                let logs: Vec<String> = [
                    "hub.log",
                    &format!("rec{i}.log"),
                    &format!("jacktrip{i}.log"),
                    &format!("jackd{i}.log"),
                    &format!("metro{i}.log"),
                ]
                .iter()
                .map(|f| {
                    format!(
                        "--- {f}\n{}",
                        std::fs::read_to_string(d.join(f)).unwrap_or_default()
                    )
                })
                .collect();
                panic!("client {i} recorded nothing\n{}", logs.join("\n"));
            }
        }
        let audio: Vec<Vec<f32>> = recs.iter().map(|p| read_wav(p)).collect();
        // Stop the hub (SIGTERM) for its report.
        let hub = &procs.0[0];
        Command::new("kill")
            .args(["-TERM", &hub.id().to_string()])
            .status()
            .unwrap();
        wait_until(10, || {
            std::fs::read_to_string(&json)
                .is_ok_and(|t| serde_json::from_str::<serde_json::Value>(&t).is_ok())
        });
        let report = std::fs::read_to_string(&json)
            .map(|t| serde_json::from_str(&t).unwrap())
            .unwrap_or_else(|_| {
                panic!(
                    "no hub report; log: {}",
                    std::fs::read_to_string(d.join("hub.log")).unwrap_or_default()
                )
            });
        drop(procs);
        SessionResult {
            audio,
            report,
            clients,
            disturbed,
        }
    })
}

/// Through the admin API: 401 without the token; set the gains (client i
/// is the one whose UDP port is 5001 + i, as `-B` bound it); `/metrics`
/// passes promtool. Returns the client list read after the gains.
fn admin_gains(n: usize, gains: &[(usize, f32)]) -> serde_json::Value {
    assert_eq!(http("GET", "/api/clients", None).0, 401);
    assert_eq!(
        http("GET", "/api/clients", Some("wrong-token-0123456789")).0,
        401
    );
    let list = || -> serde_json::Value {
        let (status, body) = http("GET", "/api/clients", Some(ADMIN_TOKEN));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let before = list();
    let id_of = |i: usize| -> u64 {
        before["clients"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                c["addr"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!(":{}", 5001 + i))
            })
            .unwrap_or_else(|| panic!("client {i} not in {before}"))["id"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(before["clients"].as_array().unwrap().len(), n, "{before}");
    for &(i, g) in gains {
        let (status, body) = http(
            "PUT",
            &format!("/api/clients/{}/gain?value={g}", id_of(i)),
            Some(ADMIN_TOKEN),
        );
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = http("PUT", "/api/clients/999/gain?value=1", Some(ADMIN_TOKEN));
    assert_eq!(status, 404);
    let (status, text) = http("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        text.contains("ringway_jacktrip_client_rx_packets_total{client="),
        "{text}"
    );
    assert_promtool_accepts(&text);
    list()
}

#[test]
fn two_jacktrip_clients_hear_each_other() {
    let r = steady_session(
        2,
        &[Some((440, 0.5)), None],
        &HubSetup {
            clocked: true,
            ..HubSetup::default()
        },
    );
    let (audio, report) = (r.audio, r.report);
    assert_eq!(report["hub"]["joins"], 2, "{report}");
    let at1 = tone_level(&audio[1], 440.0);
    assert!((0.4..0.6).contains(&at1), "440 Hz at client 1: level {at1}");
    // Client 0 does not hear itself (N-1), and nothing else plays.
    let at0 = tone_level(&audio[0], 440.0);
    assert!(at0 < ABSENT, "440 Hz came back to its sender: {at0}");
    assert!(tone_level(&audio[1], 1000.0) < ABSENT);
    assert!(
        report["hub"]["tx_forwarded"].as_u64().unwrap() > 0,
        "plain forwarding"
    );
}

#[test]
fn three_jacktrip_clients_get_the_others_mix() {
    // Client 1's 0.4 reaches the others at gain 0.5 (set through the API).
    let r = steady_session(
        3,
        &[Some((440, 0.3)), Some((1000, 0.4)), None],
        &HubSetup {
            gains: vec![(1, 0.5)],
            ..HubSetup::default()
        },
    );
    let (audio, report) = (r.audio, r.report);
    let clients = r.clients["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 3);
    for c in clients {
        assert!(c["stats"]["rx_packets"].as_u64().unwrap() > 100, "{c}");
        assert!(c["stats"]["tx_packets"].as_u64().unwrap() > 100, "{c}");
    }
    let gains: Vec<f64> = clients
        .iter()
        .map(|c| c["gain"].as_f64().unwrap())
        .collect();
    assert_eq!(gains.iter().filter(|&&g| g == 0.5).count(), 1, "{gains:?}");
    assert_eq!(report["hub"]["joins"], 3, "{report}");
    let l = |i: usize, f: f64| tone_level(&audio[i], f);
    // Client 2 hears both, at their levels.
    assert!(
        (0.22..0.38).contains(&l(2, 440.0)),
        "440 at 2: {}",
        l(2, 440.0)
    );
    assert!(
        (0.14..0.26).contains(&l(2, 1000.0)),
        "1000 at 2: {}",
        l(2, 1000.0)
    );
    // Client 0 hears 1000 Hz only, client 1 hears 440 Hz only.
    assert!(
        l(0, 440.0) < ABSENT && (0.14..0.26).contains(&l(0, 1000.0)),
        "{} {}",
        l(0, 440.0),
        l(0, 1000.0)
    );
    assert!(
        l(1, 1000.0) < ABSENT && (0.22..0.38).contains(&l(1, 440.0)),
        "{} {}",
        l(1, 1000.0),
        l(1, 440.0)
    );
}
