//! The JackTrip hub's admin API and `/metrics`, over
//! [`crate::admin_http`] (loopback, bearer token). The UDP thread owns
//! the hub: a request becomes a [`HubAdminRequest`] on a bounded channel
//! it drains at every wake (at most 20 ms later), and the answer comes
//! back on the request's own channel.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /api/clients` | clients: id, address, format, gain, idle time, counters |
//! | `PUT /api/clients/ID/gain?value=G` (or `POST`) | set a client's gain in the others' mixes (0 to 16, linear) |
//! | `DELETE /api/clients/ID` | kick a client |
//! | `GET /api/stats` | the hub's counters and the socket's |
//! | `GET /metrics` | Prometheus text (no token needed) |

use crate::admin_http::{Handler, OwnedApi, Request, Response};
use crate::metrics::PromText;
use ringway_io::IoStats;
use ringway_sfu::jacktrip::{ClientInfo, Hub, HubStats};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a handler waits for the UDP thread's answer.
const HUB_WAIT: Duration = Duration::from_secs(2);
/// Requests queued for the UDP thread at most.
pub(super) const QUEUE: usize = 16;

/// Counters the UDP thread publishes (every 50 ms) for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct HubLive {
    /// The hub's counters.
    pub hub: HubStats,
    /// The socket backend's counters.
    pub io: IoStats,
    /// UDP thread CPU seconds since start.
    pub cpu_s: Option<f64>,
    /// Clients and their counters.
    pub clients: Vec<ClientInfo>,
}

/// What the admin API asks the UDP thread to do.
#[derive(Debug, PartialEq)]
pub(super) enum HubAdminOp {
    Clients,
    SetGain(u64, f32),
    Kick(u64),
}

/// One request, with where to answer.
pub(super) struct HubAdminRequest {
    pub(super) op: HubAdminOp,
    pub(super) reply: SyncSender<Response>,
}

/// The UDP thread's side: apply `op` to the hub at `now`.
pub(super) fn apply(hub: &mut Hub, now: u64, op: HubAdminOp) -> Response {
    match op {
        HubAdminOp::Clients => Response::json(
            200,
            &serde_json::json!({
                "frames": hub.frames(),
                "clients": hub.clients_info(now),
            }),
        ),
        HubAdminOp::SetGain(id, gain) => {
            if !hub.clients().any(|c| c.0 == id) {
                Response::error(404, "no such client")
            } else if hub.set_gain(id, gain) {
                Response::json(200, &serde_json::json!({ "id": id, "gain": gain }))
            } else {
                Response::error(400, "gain must be a number from 0 to 16")
            }
        }
        HubAdminOp::Kick(id) => {
            if hub.kick(id) {
                Response::json(200, &serde_json::json!({ "kicked": id }))
            } else {
                Response::error(404, "no such client")
            }
        }
    }
}

/// The HTTP handler: `/metrics` from the live counters, `/api/...`
/// through the UDP thread, behind `token`.
pub(super) fn handler(
    token: String,
    hub: SyncSender<HubAdminRequest>,
    live: Arc<Mutex<HubLive>>,
) -> Handler {
    OwnedApi {
        owner: "hub",
        queue: hub,
        wait: HUB_WAIT,
        live,
        metrics: render_metrics,
        stats: |snapshot| {
            serde_json::json!({ "hub": snapshot.hub, "io": snapshot.io, "cpu_s": snapshot.cpu_s })
        },
        route,
        request: |op, reply| HubAdminRequest { op, reply },
    }
    .handler(token)
}

fn route(r: &Request) -> Result<HubAdminOp, Response> {
    let segs: Vec<&str> = r.path.trim_end_matches('/').split('/').skip(1).collect();
    let id = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| Response::error(400, "client id must be a number"))
    };
    match (r.method.as_str(), segs.as_slice()) {
        ("GET", ["api", "clients"]) => Ok(HubAdminOp::Clients),
        ("PUT" | "POST", ["api", "clients", c, "gain"]) => {
            let gain = r
                .query_param("value")
                .and_then(|v| v.parse::<f32>().ok())
                .ok_or_else(|| Response::error(400, "gain needs ?value=NUMBER"))?;
            Ok(HubAdminOp::SetGain(id(c)?, gain))
        }
        ("DELETE", ["api", "clients", c]) | ("POST", ["api", "clients", c, "kick"]) => {
            Ok(HubAdminOp::Kick(id(c)?))
        }
        (_, ["api", ..]) => Err(Response::error(404, "no such endpoint")),
        _ => Err(Response::error(404, "try /api/clients or /metrics")),
    }
}

/// Prometheus text for the hub: its counters (drops by reason), clients,
/// UDP thread CPU (and per datagram), per-client counters (at most
/// `max_clients` series each) and the socket backend's counters.
pub fn render_metrics(live: &HubLive) -> String {
    let mut text = PromText::default();
    render_hub_counters(&mut text, &live.hub);
    render_cpu(&mut text, live);
    render_clients(&mut text, &live.clients);
    text.io_counters("ringway_jacktrip", "mmsg", &live.io);
    text.finish()
}

/// The hub's own counters: drops by reason, traffic, handshakes, clients.
fn render_hub_counters(text: &mut PromText, stats: &HubStats) {
    for (reason, value) in [
        ("unknown_peer", stats.drop_unknown_peer),
        ("malformed", stats.drop_malformed),
        ("rate_mismatch", stats.drop_rate_mismatch),
        ("frames_mismatch", stats.drop_frames_mismatch),
    ] {
        text.counter(
            "ringway_jacktrip_drops_total",
            "Datagrams dropped, by reason.",
            &[("reason", reason)],
            value,
        );
    }
    let counters: [(&str, &str, u64); 10] = [
        ("rx_datagrams", "Datagrams handled.", stats.rx_datagrams),
        ("rx_audio", "Audio packets accepted.", stats.rx_audio),
        ("tx_packets", "Packets sent to clients.", stats.tx_packets),
        (
            "tx_forwarded",
            "Packets forwarded as received.",
            stats.tx_forwarded,
        ),
        (
            "mixes_by_deadline",
            "Mixes sent by the period deadline.",
            stats.mixes_by_deadline,
        ),
        ("handshakes", "TCP handshakes accepted.", stats.handshakes),
        (
            "handshakes_refused",
            "TCP handshakes refused (limits).",
            stats.handshakes_refused,
        ),
        ("joins", "Clients that joined.", stats.joins),
        ("exits", "Clients that sent the exit packet.", stats.exits),
        ("timeouts", "Clients removed for idleness.", stats.timeouts),
    ];
    for (name, help, value) in counters {
        text.counter(&format!("ringway_jacktrip_{name}_total"), help, &[], value);
    }
    text.counter(
        "ringway_jacktrip_kicks_total",
        "Clients removed through the admin API.",
        &[],
        stats.kicks,
    );
    text.gauge(
        "ringway_jacktrip_clients",
        "Clients now.",
        &[],
        stats.clients as f64,
    );
}

/// CPU time of the UDP thread, and per datagram once there is one.
fn render_cpu(text: &mut PromText, live: &HubLive) {
    if let Some(cpu) = live.cpu_s {
        text.counter_f64(
            "ringway_jacktrip_cpu_seconds_total",
            "CPU time of the hub's UDP thread (user + system).",
            &[],
            cpu,
        );
        if live.hub.rx_datagrams > 0 {
            text.gauge(
                "ringway_jacktrip_cpu_per_datagram_seconds",
                "UDP thread CPU per datagram handled, since start.",
                &[],
                cpu / live.hub.rx_datagrams as f64,
            );
        }
    }
}

/// One series of each per-client counter for every client.
fn render_clients(text: &mut PromText, clients: &[ClientInfo]) {
    for client in clients {
        let id = client.id.to_string();
        let labels = [("client", id.as_str())];
        let stats = &client.stats;
        for (name, help, value) in [
            (
                "rx_packets",
                "Audio packets from the client.",
                stats.rx_packets,
            ),
            (
                "tx_packets",
                "Packets sent to the client.",
                stats.tx_packets,
            ),
            ("lost", "Sequence numbers the client skipped.", stats.lost),
            (
                "late",
                "Packets behind the client's highest sequence number.",
                stats.late,
            ),
        ] {
            text.counter(
                &format!("ringway_jacktrip_client_{name}_total"),
                help,
                &labels,
                value,
            );
        }
        text.gauge(
            "ringway_jacktrip_client_gain",
            "Gain of the client's audio in the others' mixes.",
            &labels,
            f64::from(client.gain),
        );
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
        let ok = |m, p| route(&req(m, p)).ok();
        assert_eq!(ok("GET", "/api/clients"), Some(HubAdminOp::Clients));
        assert_eq!(
            ok("PUT", "/api/clients/3/gain?value=0.5"),
            Some(HubAdminOp::SetGain(3, 0.5))
        );
        assert_eq!(ok("DELETE", "/api/clients/7"), Some(HubAdminOp::Kick(7)));
        let status = |m, p| route(&req(m, p)).err().map(|r| r.status);
        assert_eq!(status("PUT", "/api/clients/3/gain"), Some(400));
        assert_eq!(status("PUT", "/api/clients/x/gain?value=1"), Some(400));
        assert_eq!(status("GET", "/api/nothing"), Some(404));
    }
}
