//! The SFU's admin API and `/metrics`: JSON handlers over
//! [`crate::admin_http`] (loopback, bearer token), answered by the engine
//! thread, which owns the core: a request becomes an [`AdminRequest`] on a
//! bounded channel the engine drains between receive batches (at most one
//! poll interval, 20 ms, later), and the reply comes back on its own
//! channel.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /api/rooms` | rooms, their clients, per-client stream statistics |
//! | `POST /api/rooms/NAME[?max_clients=N]` | create a room (kept while empty) |
//! | `DELETE /api/rooms/NAME` | close a room: kick everyone in it |
//! | `DELETE /api/clients/SSID` | kick a client (its token is revoked) |
//! | `GET /api/stats` | the core's counters |
//! | `GET /metrics` | Prometheus text (no token needed) |

use super::LiveStats;
use crate::admin_http::{Handler, OwnedApi, Request, Response};
use crate::metrics::PromText;
use ringway_sfu::{RoomError, Sfu, SfuStats};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a handler waits for the engine's answer.
const ENGINE_WAIT: Duration = Duration::from_secs(2);
/// Requests queued for the engine at most.
pub(super) const QUEUE: usize = 16;

/// What the admin API asks the engine to do.
#[derive(Debug)]
pub(super) enum AdminOp {
    Rooms,
    Kick(u32),
    CreateRoom(String, Option<usize>),
    CloseRoom(String),
}

/// One request to the engine, with where to answer.
pub(super) struct AdminRequest {
    pub(super) op: AdminOp,
    pub(super) reply: SyncSender<Response>,
}

/// The engine's side: apply `op` to the core at `now`.
pub(super) fn apply(sfu: &mut Sfu, now: u64, op: AdminOp) -> Response {
    let room_error = |e: RoomError| {
        let status = match e {
            RoomError::BadName => 400,
            RoomError::NoSuchRoom => 404,
            RoomError::Exists | RoomError::TooManyRooms => 409,
        };
        Response::error(status, &e.to_string())
    };
    match op {
        AdminOp::Rooms => Response::json(200, &serde_json::json!({ "rooms": sfu.rooms_info(now) })),
        AdminOp::Kick(ssid) => {
            if sfu.kick(ssid) {
                Response::json(200, &serde_json::json!({ "kicked": ssid }))
            } else {
                Response::error(404, "no such client")
            }
        }
        AdminOp::CreateRoom(name, max) => match sfu.create_room(&name, max) {
            Ok(()) => Response::json(201, &serde_json::json!({ "created": name })),
            Err(e) => room_error(e),
        },
        AdminOp::CloseRoom(name) => match sfu.close_room(&name) {
            Ok(n) => Response::json(200, &serde_json::json!({ "closed": name, "kicked": n })),
            Err(e) => room_error(e),
        },
    }
}

/// The channel the engine drains.
pub(super) fn channel() -> (SyncSender<AdminRequest>, Receiver<AdminRequest>) {
    sync_channel(QUEUE)
}

/// The HTTP handler: `/metrics` from the live counters, `/api/...` through
/// the engine, behind `token`.
pub(super) fn handler(
    token: String,
    engine: SyncSender<AdminRequest>,
    live: Arc<Mutex<LiveStats>>,
) -> Handler {
    OwnedApi {
        owner: "engine",
        queue: engine,
        wait: ENGINE_WAIT,
        live,
        metrics: render_metrics,
        stats: |snapshot| serde_json::json!({ "sfu": snapshot.sfu, "io": snapshot.io }),
        route,
        request: |op, reply| AdminRequest { op, reply },
    }
    .handler(token)
}

fn route(r: &Request) -> Result<AdminOp, Response> {
    let segs: Vec<&str> = r.path.trim_end_matches('/').split('/').skip(1).collect();
    match (r.method.as_str(), segs.as_slice()) {
        ("GET", ["api", "rooms"]) => Ok(AdminOp::Rooms),
        ("POST", ["api", "rooms", name]) => {
            let max = match r.query_param("max_clients") {
                Some(v) => Some(
                    v.parse::<usize>()
                        .map_err(|_| Response::error(400, "max_clients must be a number"))?,
                ),
                None => None,
            };
            Ok(AdminOp::CreateRoom(name.to_string(), max))
        }
        ("DELETE", ["api", "rooms", name]) => Ok(AdminOp::CloseRoom(name.to_string())),
        ("DELETE", ["api", "clients", ssid]) | ("POST", ["api", "clients", ssid, "kick"]) => ssid
            .parse()
            .map(AdminOp::Kick)
            .map_err(|_| Response::error(400, "SSID must be a number")),
        (_, ["api", ..]) => Err(Response::error(404, "no such endpoint")),
        _ => Err(Response::error(404, "try /api/rooms or /metrics")),
    }
}

/// Prometheus text for the SFU: the core's counters (drops by reason),
/// clients, rooms (and clients per room), engine CPU and CPU per media
/// packet, the backend's counters.
pub fn render_metrics(l: &LiveStats) -> String {
    let mut text = PromText::default();
    crate::metrics::process_metrics(&mut text);
    drop_counters(&mut text, l);
    token_counters(&mut text, &l.sfu);
    core_counters(&mut text, l);
    gauges(&mut text, l);
    engine_and_backend(&mut text, l);
    text.finish()
}

/// Drops and refusals, one series per reason.
fn drop_counters(p: &mut PromText, l: &LiveStats) {
    let stats = &l.sfu;
    let drops: [(&str, u64); 17] = [
        ("malformed", stats.drop_malformed),
        ("unregistered", stats.drop_unregistered),
        ("unverified", stats.drop_unverified),
        ("unknown_payload_type", stats.drop_unknown_pt),
        ("bad_token", stats.drop_bad_token),
        ("unknown_ssid", stats.drop_unknown_ssid),
        ("wrong_address", stats.drop_wrong_address),
        ("unexpected_control", stats.drop_unexpected_control),
        ("not_admitted", stats.drop_not_admitted),
        ("bad_cookie", stats.drop_bad_cookie),
        ("rate_limited", stats.rate_limited),
        ("not_allowed", stats.drop_not_allowed),
        ("table_full", stats.rejected_register),
        ("room_full", stats.rejected_room_full),
        ("no_room", stats.rejected_no_room),
        ("too_many_subs", stats.rejected_subscribe),
        ("truncated", l.truncated),
    ];
    for (reason, v) in drops {
        p.counter(
            "ringway_sfu_drops_total",
            "Datagrams and requests dropped or refused, by reason.",
            &[("reason", reason)],
            v,
        );
    }
}

/// Join tokens refused, by reason.
fn token_counters(p: &mut PromText, s: &SfuStats) {
    let tokens: [(&str, u64); 6] = [
        ("missing", s.token_missing),
        ("malformed", s.token_malformed),
        ("forged", s.token_forged),
        ("expired", s.token_expired),
        ("wrong_room", s.token_wrong_room),
        ("revoked", s.token_revoked),
    ];
    for (reason, v) in tokens {
        p.counter(
            "ringway_sfu_token_refused_total",
            "Join tokens refused, by reason.",
            &[("reason", reason)],
            v,
        );
    }
}

/// The core's and the engine's plain counters.
fn core_counters(p: &mut PromText, l: &LiveStats) {
    let stats = &l.sfu;
    let counters: [(&str, &str, u64); 13] = [
        (
            "ringway_sfu_rx_datagrams_total",
            "Datagrams handled by the core.",
            stats.rx_datagrams,
        ),
        (
            "ringway_sfu_media_packets_total",
            "Media packets accepted for forwarding.",
            stats.media_accepted,
        ),
        (
            "ringway_sfu_copies_total",
            "Copies sent to subscribers.",
            stats.copies,
        ),
        (
            "ringway_sfu_echoes_total",
            "Echo copies sent back to senders.",
            stats.echoes,
        ),
        (
            "ringway_sfu_challenges_total",
            "CHALLENGEs sent.",
            stats.challenges,
        ),
        (
            "ringway_sfu_registrations_total",
            "Clients registered.",
            stats.registrations,
        ),
        (
            "ringway_sfu_leaves_total",
            "Clients that left.",
            stats.leaves,
        ),
        (
            "ringway_sfu_timeouts_total",
            "Clients removed for idleness.",
            stats.timeouts,
        ),
        (
            "ringway_sfu_kicks_total",
            "Clients kicked by the operator.",
            stats.kicks,
        ),
        (
            "ringway_sfu_rebinds_total",
            "Sessions moved to a new address.",
            stats.rebinds,
        ),
        (
            "ringway_sfu_rx_bytes_total",
            "Bytes received by the engine.",
            l.rx_bytes,
        ),
        (
            "ringway_sfu_tx_bytes_total",
            "Bytes sent by the engine.",
            l.tx_bytes,
        ),
        (
            "ringway_sfu_errors_sent_total",
            "ERROR replies sent.",
            stats.errors_sent,
        ),
    ];
    for (name, help, v) in counters {
        p.counter(name, help, &[], v);
    }
}

/// Clients, rooms and clients per room now.
fn gauges(p: &mut PromText, l: &LiveStats) {
    let stats = &l.sfu;
    p.gauge(
        "ringway_sfu_clients",
        "Registered clients.",
        &[],
        stats.clients as f64,
    );
    p.gauge("ringway_sfu_rooms", "Rooms.", &[], stats.rooms as f64);
    p.gauge(
        "ringway_sfu_static_room_members",
        "Static-room members.",
        &[],
        stats.room_members as f64,
    );
    p.gauge(
        "ringway_sfu_revoked_tokens",
        "Revoked tokens remembered.",
        &[],
        stats.revoked as f64,
    );
    for (room, n) in &l.rooms {
        p.gauge(
            "ringway_sfu_room_clients",
            "Clients per room (at most max_rooms series).",
            &[("room", room)],
            *n as f64,
        );
    }
}

/// Engine CPU, recorder drops and the backend's counters.
fn engine_and_backend(p: &mut PromText, l: &LiveStats) {
    let stats = &l.sfu;
    if let Some(cpu) = l.engine_cpu_s {
        p.counter_f64(
            "ringway_sfu_engine_cpu_seconds_total",
            "CPU time of the engine thread, or of the engines with one per receive queue (user + system).",
            &[],
            cpu,
        );
        if stats.rx_datagrams > 0 {
            p.gauge(
                "ringway_sfu_engine_cpu_per_datagram_seconds",
                "Engine CPU per datagram handled, since start.",
                &[],
                cpu / stats.rx_datagrams as f64,
            );
        }
    }
    if let Some(count) = l.record_queue_drops {
        p.counter(
            "ringway_sfu_record_queue_drops_total",
            "Packets not recorded because the recorder's channel was full.",
            &[],
            count,
        );
    }
    p.io_counters("ringway_sfu", &l.backend, &l.io);
    per_engine(p, l);
}

/// With one engine per receive queue: each engine's share (the totals
/// above are their sums).
fn per_engine(p: &mut PromText, l: &LiveStats) {
    for engine in &l.engines {
        let queue = engine.queue.to_string();
        let labels = [("queue", queue.as_str())];
        let counters = &engine.counters;
        for (name, help, value) in [
            (
                "ringway_sfu_queue_datagrams_total",
                "Datagrams the engine of a receive queue took.",
                counters.datagrams,
            ),
            (
                "ringway_sfu_queue_media_total",
                "Media packets the engine of a receive queue forwarded itself.",
                counters.media,
            ),
            (
                "ringway_sfu_queue_to_control_total",
                "Datagrams the engine of a receive queue handed to the control thread.",
                counters.to_control,
            ),
            (
                "ringway_sfu_queue_to_control_dropped_total",
                "Datagrams dropped because the control thread's queue was full.",
                counters.to_control_dropped,
            ),
        ] {
            p.counter(name, help, &labels, value);
        }
        if let Some(cpu) = engine.cpu_s {
            p.counter_f64(
                "ringway_sfu_queue_cpu_seconds_total",
                "CPU time of the engine of a receive queue (user + system).",
                &labels,
                cpu,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str) -> Request {
        crate::admin_http::parse_request(format!("{method} {path} HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap()
    }

    #[test]
    fn routes() {
        assert!(matches!(
            route(&req("GET", "/api/rooms")),
            Ok(AdminOp::Rooms)
        ));
        assert!(matches!(
            route(&req("POST", "/api/rooms/jam?max_clients=3")),
            Ok(AdminOp::CreateRoom(n, Some(3))) if n == "jam"
        ));
        assert!(matches!(
            route(&req("DELETE", "/api/clients/7")),
            Ok(AdminOp::Kick(7))
        ));
        assert!(matches!(
            route(&req("POST", "/api/clients/7/kick")),
            Ok(AdminOp::Kick(7))
        ));
        assert_eq!(
            route(&req("DELETE", "/api/clients/x"))
                .err()
                .unwrap()
                .status,
            400
        );
        assert_eq!(route(&req("GET", "/nope")).err().unwrap().status, 404);
    }
}
