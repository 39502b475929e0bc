//! Prometheus text of a SIP server snapshot (metric names documented in
//! docs/sip-proxy.md). Conventions (checked by `promtool check metrics` in
//! tests/sip_proxy_metrics.rs): base units (seconds), counters end in
//! `_total`, every metric has HELP and TYPE, one name per meaning with
//! labels for its dimensions.

use super::stats::{Latency, WorkerMetrics};
use super::{Bounds, Snapshot};
use crate::metrics::PromText;
use ringway_sip::ProxyStats;

/// A core counter: its name, its help, and how to read it from the core's statistics.
type CoreCounter = (&'static str, &'static str, fn(&ProxyStats) -> u64);

/// The core's counters, in the order they are rendered.
const CORE_COUNTERS: [CoreCounter; 35] = [
    (
        "ringway_sip_core_requests_received_total",
        "Requests the core parsed.",
        |stats| stats.requests_received,
    ),
    (
        "ringway_sip_core_responses_received_total",
        "Responses the core parsed.",
        |stats| stats.responses_received,
    ),
    (
        "ringway_sip_core_requests_forwarded_total",
        "Requests forwarded, including CANCEL and ACK the proxy generated.",
        |stats| stats.requests_forwarded,
    ),
    (
        "ringway_sip_core_responses_forwarded_total",
        "Responses forwarded upstream.",
        |stats| stats.responses_forwarded,
    ),
    (
        "ringway_sip_transactions_created_total",
        "Transactions created (stateful mode).",
        |stats| stats.transactions_created,
    ),
    (
        "ringway_sip_transactions_timed_out_total",
        "Transactions ended by timer B, F or C.",
        |stats| stats.transactions_timed_out,
    ),
    (
        "ringway_sip_retransmissions_absorbed_total",
        "Retransmissions absorbed by a transaction.",
        |stats| stats.retransmissions_absorbed,
    ),
    (
        "ringway_sip_retransmissions_sent_total",
        "Retransmissions sent by timers A, E and G.",
        |stats| stats.retransmissions_sent,
    ),
    (
        "ringway_sip_overload_sheds_total",
        "Requests refused because the transaction table was full.",
        |stats| stats.overload_sheds,
    ),
    (
        "ringway_sip_overload_queue_sheds_total",
        "New INVITEs answered 503 before any state because the receive queue was too long.",
        |stats| stats.overload_queue_sheds,
    ),
    (
        "ringway_sip_drain_refusals_total",
        "New requests answered 503 + Retry-After while draining.",
        |stats| stats.drain_refusals,
    ),
    (
        "ringway_sip_overload_stateless_total",
        "In-dialog requests forwarded statelessly because the transaction table was full.",
        |stats| stats.overload_stateless,
    ),
    (
        "ringway_sip_cancels_matched_2543_total",
        "CANCELs matched to their INVITE the RFC 2543 way.",
        |stats| stats.cancels_matched_2543,
    ),
    (
        "ringway_sip_auth_accepted_total",
        "Requests whose digest credentials were verified.",
        |stats| stats.auth_accepted,
    ),
    (
        "ringway_sip_auth_refused_total",
        "Requests refused by authentication (400, 403, 500).",
        |stats| stats.auth_refused,
    ),
    (
        "ringway_sip_auth_stale_total",
        "Challenges with stale=true.",
        |stats| stats.auth_stale,
    ),
    (
        "ringway_sip_auth_replays_total",
        "Replayed credentials answered with a new challenge.",
        |stats| stats.auth_replays,
    ),
    (
        "ringway_sip_relay_refused_total",
        "Requests whose next hop the relay policy refused (403/482; ACK, CANCEL dropped).",
        |stats| stats.relay_refused,
    ),
    (
        "ringway_sip_flood_blocks_total",
        "Times a source went over the flood limit.",
        |stats| stats.flood_blocks,
    ),
    (
        "ringway_sip_flood_untracked_total",
        "Requests the flood limiter could not track (table set full).",
        |stats| stats.flood_untracked,
    ),
    (
        "ringway_sip_store_deferred_total",
        "Requests handed to the location driver to wait for a remote store.",
        |stats| stats.store_deferred,
    ),
    (
        "ringway_sip_store_queue_full_total",
        "Requests answered as if the store were down because the location queue was full.",
        |stats| stats.store_queue_full,
    ),
    (
        "ringway_sip_store_unavailable_registers_total",
        "REGISTERs answered 500 with Retry-After because the location store was unavailable.",
        |stats| stats.store_unavailable_registers,
    ),
    (
        "ringway_sip_store_unavailable_lookups_total",
        "Requests answered 480 because the location store was unavailable for their lookup.",
        |stats| stats.store_unavailable_lookups,
    ),
    (
        "ringway_sip_names_parked_total",
        "Requests parked until their next hop's name was resolved (not in the DNS cache).",
        |stats| stats.names_parked,
    ),
    (
        "ringway_sip_names_failed_total",
        "Requests answered 404 because their next hop's name has no address.",
        |stats| stats.names_failed,
    ),
    (
        "ringway_sip_names_unavailable_total",
        "Requests answered 503 (ACK, CANCEL dropped) because their next hop's name was not resolved.",
        |stats| stats.names_unavailable,
    ),
    (
        "ringway_sip_failovers_total",
        "Times a transaction moved on to the next RFC 3263 target (timeout, 503, transport error).",
        |stats| stats.failovers,
    ),
    (
        "ringway_sip_flows_failed_total",
        "Requests for a registered flow whose connection is gone: answered 430 Flow Failed (RFC 5626; ACK dropped).",
        |stats| stats.flows_failed,
    ),
    (
        "ringway_sip_flow_failures_received_total",
        "430 Flow Failed answers to requests sent to a binding through its Path: that Path's bindings removed (RFC 5626 7).",
        |stats| stats.flow_failures_received,
    ),
    (
        "ringway_sip_flow_retries_total",
        "Requests moved on to another binding of their AOR after a 430 Flow Failed.",
        |stats| stats.flow_retries,
    ),
    (
        "ringway_sip_transport_errors_total",
        "Forwarded requests the transport could not deliver (connection refused or reset, TLS handshake failed, ICMP unreachable for their UDP target): next target at once, or 500.",
        |stats| stats.transport_errors,
    ),
    (
        "ringway_sip_icmp_unreachable_total",
        "ICMP unreachable errors the kernel reported for UDP destinations the proxy sent to (IP_RECVERR); each moves on the transactions waiting there (stateless: counted only).",
        |stats| stats.unreachable_reports,
    ),
    (
        "ringway_sip_dialogs_confirmed_total",
        "Dialogs set up through the proxy (stateful: first 2xx to an INVITE outside a dialog).",
        |stats| stats.dialogs_confirmed,
    ),
    (
        "ringway_sip_dialogs_ended_total",
        "Tracked dialogs ended by a BYE through the proxy.",
        |stats| stats.dialogs_ended,
    ),
];

/// A connection counter: its name, its help, and how to read it from a
/// transport's row.
type TransportCounter = (&'static str, &'static str, fn(&super::TcpSnapshot) -> u64);

/// The counters of the connection transports, one row per transport
/// (`tcp`, `tls`, `ws`, `wss`) listened on or used; each family's samples
/// together (the text format wants them contiguous). Named
/// `PREFIX_connections_…`: `ringway_sip` for the proxy, `ringway_dispatch`
/// for the dispatcher (the same driver).
pub(crate) fn render_transport(p: &mut PromText, prefix: &str, s: &super::TcpSnapshot) {
    let rows: Vec<(&str, &super::TcpSnapshot)> = s
        .by_transport
        .iter()
        .map(|(t, row)| (t.as_str(), row))
        .collect();
    for (t, row) in &rows {
        p.gauge(
            &format!("{prefix}_connections_open"),
            "Connections open now.",
            &[("transport", t)],
            row.open as f64,
        );
    }
    let simple: [TransportCounter; 5] = [
        ("connections_accepted_total", "Connections accepted.", |r| {
            r.accepted
        }),
        (
            "connections_opened_total",
            "Connections opened to next hops.",
            |r| r.connected,
        ),
        (
            "connections_aliased_total",
            "Connections that took an RFC 5923 alias (a Via alias on them).",
            |r| r.aliases,
        ),
        (
            "keepalive_pings_total",
            "CRLF CRLF keep-alive pings answered with a pong (RFC 5626 4.4.1; WebSocket pings).",
            |r| r.pings,
        ),
        (
            "transport_no_connection_total",
            "Messages dropped because their connection was gone or could not be opened.",
            |r| r.no_connection,
        ),
    ];
    for (name, help, value) in simple {
        let name = format!("{prefix}_{name}");
        for (t, row) in &rows {
            p.counter(&name, help, &[("transport", t)], value(row));
        }
    }
    for (t, row) in &rows {
        for (reason, v) in [
            ("limit", row.refused_limit),
            ("per_ip", row.refused_per_ip),
            ("descriptors", row.refused_descriptors),
        ] {
            p.counter(
                &format!("{prefix}_connections_refused_total"),
                "Accepted connections closed at once, by the bound they hit.",
                &[("transport", t), ("reason", reason)],
                v,
            );
        }
    }
    for (t, row) in &rows {
        for (reason, v) in &row.closed {
            p.counter(
                &format!("{prefix}_connections_closed_total"),
                "Connections closed, by reason.",
                &[("transport", t), ("reason", reason)],
                *v,
            );
        }
    }
    for (t, row) in &rows {
        for (direction, v) in [("in", row.bytes_in), ("out", row.bytes_out)] {
            p.counter(
                &format!("{prefix}_transport_bytes_total"),
                "Bytes read from and written to connections.",
                &[("transport", t), ("direction", direction)],
                v,
            );
        }
    }
    for (t, row) in &rows {
        for (direction, v) in [("in", row.messages_in), ("out", row.messages_out)] {
            p.counter(
                &format!("{prefix}_transport_messages_total"),
                "Messages framed off and sent over connections.",
                &[("transport", t), ("direction", direction)],
                v,
            );
        }
    }
    for (outcome, v) in [
        ("reported", s.undelivered),
        ("dropped", s.undelivered_dropped),
    ] {
        p.counter(
            "ringway_sip_transport_undelivered_total",
            "Messages on connections the proxy opened that closed before they were up (or could not be opened): reported to the core as transport errors, or dropped (queue full).",
            &[("outcome", outcome)],
            v,
        );
    }
}

/// Prometheus text of the current state.
pub(super) fn render(snap: &Snapshot) -> String {
    let mut text = PromText::default();
    crate::metrics::process_metrics(&mut text);
    datagram_counters(&mut text, snap);
    per_type_counters(&mut text, &snap.metrics);
    latency_histograms(&mut text, &snap.metrics);
    core_metrics(&mut text, &snap.proxy);
    text.gauge(
        "ringway_sip_metrics_stale_threads",
        "Threads that did not publish for this scrape in time (their previous copy was used).",
        &[],
        snap.stale_threads as f64,
    );
    if let Some((now, lowest)) = snap.metrics.overload_admitted_ratio() {
        // Shedding on only: no sample rather than a made-up 1.
        text.gauge(
            "ringway_sip_overload_admitted_ratio",
            "Fraction of new INVITEs the overload controllers admit now (mean over workers).",
            &[],
            now,
        );
        text.gauge(
            "ringway_sip_overload_admitted_min_ratio",
            "Lowest fraction of new INVITEs any worker's overload controller admitted since start.",
            &[],
            lowest,
        );
    }
    if let Some(reduction) = snap.metrics.overload_oc_reduction() {
        text.gauge(
            "ringway_sip_overload_control_reduction_percent",
            "Reduction of new requests advertised to RFC 7339 overload control clients (oc, mean over workers).",
            &[],
            reduction,
        );
        text.gauge(
            "ringway_sip_overload_control_capacity_calls_per_second",
            "New calls per second the workers measured they complete while saturated (summed; 0: no overload seen).",
            &[],
            snap.metrics.overload_oc_capacity as f64,
        );
    }
    state_bounds(&mut text, &snap.proxy, &snap.config);
    thread_metrics(&mut text, snap);
    // Not known locally with a shared store: no sample rather than 0.
    if let Some(bindings) = snap.proxy.bindings {
        text.gauge(
            "ringway_sip_registrar_bindings",
            "Registrar bindings stored (in-memory store only).",
            &[],
            bindings as f64,
        );
    }
    if let Some(dns) = &snap.dns {
        dns.resolver.prometheus(&mut text);
        text.counter(
            "ringway_sip_names_parked_refused_total",
            "Requests refused because the parked set (count, bytes) or the resolver queue was full.",
            &[],
            dns.parked_refused,
        );
        text.counter(
            "ringway_sip_names_parked_expired_total",
            "Parked requests given up after the wait bound (answered 503).",
            &[],
            dns.parked_expired,
        );
        text.gauge(
            "ringway_sip_names_parked",
            "Requests parked on a name now.",
            &[],
            dns.parked as f64,
        );
    }
    if let Some(location) = &snap.location {
        location_metrics(&mut text, location);
    }
    let cpu = snap.process_cpu;
    for (mode, ns) in [("user", cpu.user_ns), ("system", cpu.system_ns)] {
        text.counter_f64(
            "ringway_sip_cpu_seconds_total",
            "Process CPU time since start.",
            &[("mode", mode)],
            ns as f64 / 1e9,
        );
    }
    text.finish()
}

/// Datagrams in and out, errors, and the kernel's drops.
fn datagram_counters(text: &mut PromText, snap: &Snapshot) {
    let metrics = &snap.metrics;
    for (name, help, value) in [
        (
            "ringway_sip_messages_in_total",
            "Datagrams received.",
            metrics.msgs_in,
        ),
        (
            "ringway_sip_messages_out_total",
            "Datagrams sent.",
            metrics.msgs_out,
        ),
        (
            "ringway_sip_timer_out_total",
            "Datagrams sent by timers.",
            metrics.timer_out,
        ),
        (
            "ringway_sip_tx_errors_total",
            "Datagrams the kernel refused.",
            metrics.tx_errors,
        ),
        (
            "ringway_sip_rx_errors_total",
            "Receive syscall errors.",
            metrics.rx_errors,
        ),
        (
            "ringway_sip_wakeups_total",
            "Wake-ups of the workers' receive loops: receives that brought datagrams, and coalescing windows after which none had come (messages_in / wakeups: datagrams per wake-up).",
            metrics.wakeups,
        ),
        (
            "ringway_sip_rx_coalesce_windows_total",
            "Receive-coalescing windows the workers slept (--rx-coalesce-us).",
            metrics.rx_coalesce_windows,
        ),
        (
            "ringway_sip_rx_truncated_total",
            "Datagrams larger than a frame (dropped).",
            metrics.rx_truncated,
        ),
        (
            "ringway_sip_overload_queue_drops_total",
            "New INVITEs dropped unanswered for waiting over twice the shedding delay.",
            metrics.overload_queue_drops,
        ),
        (
            "ringway_sip_overload_invite_resends_total",
            "New INVITEs that were resends of ones dropped unanswered.",
            metrics.overload_invite_resends,
        ),
        (
            "ringway_sip_socket_drops_total",
            "SO_RXQ_OVFL drops of the proxy sockets.",
            metrics.socket_rx_dropped,
        ),
    ] {
        text.counter(name, help, &[], value);
    }
    for (value, name) in [
        (snap.udp.rcvbuf_errors, "rcvbuf_errors"),
        (snap.udp.in_errors, "in_errors"),
    ] {
        text.counter(
            &format!("ringway_sip_udp_{name}_total"),
            "/proc/net/snmp Udp counter delta since start.",
            &[],
            value,
        );
    }
    if let Some(tcp) = &snap.tcp {
        render_transport(text, "ringway_sip", tcp);
    }
    if let Some(tls) = &snap.tls {
        render_tls(text, "ringway_sip", tls);
    }
    if let Some(keepalive) = &snap.keepalive {
        render_keepalive(text, keepalive);
    }
}

/// The registrar's flows: keepalives and bindings removed.
fn render_keepalive(p: &mut PromText, s: &super::keepalive::KeepaliveSnapshot) {
    for (transport, v) in [("udp", s.udp_flows), ("connection", s.connection_flows)] {
        p.gauge(
            "ringway_sip_binding_flows",
            "Flows (UDP source addresses, connections) with bindings, tracked now.",
            &[("kind", transport)],
            v as f64,
        );
    }
    for (name, help, v) in [
        (
            "ringway_sip_keepalives_sent_total",
            "Keepalive OPTIONS sent towards UDP bindings.",
            s.sent,
        ),
        (
            "ringway_sip_keepalive_replies_total",
            "Answers to keepalive OPTIONS from the flow's address.",
            s.replies,
        ),
        (
            "ringway_sip_keepalive_stun_total",
            "RFC 5626 STUN keepalives answered.",
            s.stun,
        ),
        (
            "ringway_sip_keepalive_send_errors_total",
            "Keepalives the kernel refused.",
            s.send_errors,
        ),
        (
            "ringway_sip_keepalive_rate_limited_total",
            "Keepalive ticks that left due pings for later (rate bound).",
            s.rate_limited,
        ),
        (
            "ringway_sip_keepalive_untracked_total",
            "Flows not tracked (capacity or AORs per flow reached).",
            s.untracked,
        ),
        (
            "ringway_sip_keepalive_dead_flows_total",
            "UDP flows found dead (keepalives unanswered).",
            s.dead_udp_flows,
        ),
    ] {
        p.counter(name, help, &[], v);
    }
    for (reason, v) in [
        ("keepalive", s.removed_keepalive),
        ("connection_closed", s.removed_connection_closed),
    ] {
        p.counter(
            "ringway_sip_bindings_removed_total",
            "Bindings removed because their flow died.",
            &[("reason", reason)],
            v,
        );
    }
}

/// The TLS layer: handshakes per transport over TLS (`tls`, `wss`), their
/// failures and bounds, reloads.
pub(crate) fn render_tls(p: &mut PromText, prefix: &str, s: &super::TlsSnapshot) {
    for (t, row) in &s.by_transport {
        p.counter(
            &format!("{prefix}_tls_handshakes_total"),
            "TLS handshakes completed (accepted and opened).",
            &[("transport", t)],
            row.handshakes,
        );
    }
    for (t, row) in &s.by_transport {
        for (reason, v) in [
            ("failed", row.handshake_failures),
            ("timeout", row.handshake_timeouts),
            ("refused", row.handshakes_refused),
        ] {
            p.counter(
                &format!("{prefix}_tls_handshake_failures_total"),
                "TLS handshakes that failed, timed out, or were refused (max_handshakes in progress).",
                &[("transport", t), ("reason", reason)],
                v,
            );
        }
    }
    // One handshake bound and one certificate set for both transports.
    let l = [("transport", "tls")];
    p.gauge(
        &format!("{prefix}_tls_handshakes_in_progress"),
        "TLS handshakes in progress now (tls and wss together).",
        &l,
        s.in_handshake as f64,
    );
    p.counter(
        &format!("{prefix}_tls_reloads_total"),
        "Certificate reloads applied.",
        &l,
        s.reloads,
    );
    p.counter(
        &format!("{prefix}_tls_reload_failures_total"),
        "Certificate reloads refused (the certificates in use stay).",
        &l,
        s.reload_failures,
    );
}

/// Messages received, forwarded, absorbed, answered and dropped, by type.
fn per_type_counters(text: &mut PromText, metrics: &WorkerMetrics) {
    for (label, stats) in metrics.types() {
        let label = label.as_str();
        let by_type = [("type", label)];
        text.counter(
            "ringway_sip_messages_by_type_total",
            "Messages received by type.",
            &by_type,
            stats.count,
        );
        text.counter(
            "ringway_sip_forwarded_total",
            "Messages forwarded by type.",
            &by_type,
            stats.forwarded,
        );
        text.counter(
            "ringway_sip_absorbed_total",
            "Messages absorbed by type.",
            &by_type,
            stats.absorbed,
        );
        for (code, count) in stats.responded() {
            text.counter(
                "ringway_sip_responded_total",
                "Responses generated by the proxy.",
                &[("type", label), ("code", &code.to_string())],
                count,
            );
        }
        for (reason, count) in stats.dropped() {
            text.counter(
                "ringway_sip_core_drops_total",
                "Messages dropped by the core.",
                &[("type", label), ("reason", &reason)],
                count,
            );
        }
    }
}

/// One histogram per latency and message type.
fn latency_histograms(text: &mut PromText, metrics: &WorkerMetrics) {
    for latency in Latency::ALL {
        let name = format!("ringway_sip_{}_seconds", latency.name());
        let help = match latency {
            Latency::KRcv => "Kernel RX timestamp to the start of processing (eq. 1 K_rcv).",
            Latency::TSip => "Processing time inside the proxy core.",
            Latency::KSnd => "Application send to kernel TX timestamp (sampled).",
            Latency::Wait => "Wait after processing until the send call.",
        };
        for (label, stats) in metrics.types() {
            text.histogram(
                &name,
                help,
                &[("type", label.as_str())],
                stats.histogram(latency),
            );
        }
    }
}

/// The core's own counters and its two state gauges.
fn core_metrics(text: &mut PromText, stats: &ProxyStats) {
    for (name, help, read) in CORE_COUNTERS {
        text.counter(name, help, &[], read(stats));
    }
    for (code, count) in &stats.responses_generated {
        text.counter(
            "ringway_sip_core_responses_generated_total",
            "Responses the core generated (including timers' 408/487), by code.",
            &[("code", &code.to_string())],
            *count,
        );
    }
    for (name, help, value) in [
        (
            "ringway_sip_transactions_active",
            "Transactions in the table.",
            stats.transactions_active,
        ),
        (
            "ringway_sip_flood_sources_tracked",
            "Sources the flood limiter tracks.",
            stats.flood_sources_tracked,
        ),
        (
            "ringway_sip_dialogs_open",
            "Dialogs set up through the proxy and not ended by a BYE through it (what --drain-dialogs waits for).",
            stats.dialogs_open,
        ),
    ] {
        text.gauge(name, help, &[], value as f64);
    }
}

/// The state the core holds next to its configured bounds (review S9).
fn state_bounds(text: &mut PromText, stats: &ProxyStats, bounds: &Bounds) {
    for (name, help, value) in [
        (
            "ringway_sip_transaction_bytes",
            "Bytes the transaction table holds (kept requests and responses included).",
            stats.transaction_bytes as f64,
        ),
        (
            "ringway_sip_transaction_bytes_max",
            "Bound on ringway_sip_transaction_bytes (max_transaction_bytes).",
            bounds.max_transaction_bytes as f64,
        ),
        (
            "ringway_sip_timer_entries",
            "Deadlines queued in the transaction timer heaps (stale ones included).",
            stats.timer_entries as f64,
        ),
        (
            "ringway_sip_transactions_max",
            "Bound on ringway_sip_transactions_active (max_transactions).",
            bounds.max_transactions as f64,
        ),
    ] {
        text.gauge(name, help, &[], value);
    }
    if let Some(bytes) = stats.binding_bytes {
        text.gauge(
            "ringway_sip_registrar_binding_bytes",
            "Bytes the registrar bindings take (in-memory store only).",
            &[],
            bytes as f64,
        );
        text.gauge(
            "ringway_sip_registrar_binding_bytes_max",
            "Bound on ringway_sip_registrar_binding_bytes (max_binding_bytes).",
            &[],
            bounds.max_binding_bytes as f64,
        );
        text.gauge(
            "ringway_sip_registrar_bindings_max",
            "Bound on ringway_sip_registrar_bindings (max_bindings).",
            &[],
            bounds.max_bindings as f64,
        );
    }
}

/// Threads running, started and panicked.
fn thread_metrics(text: &mut PromText, snap: &Snapshot) {
    text.gauge(
        "ringway_sip_threads_alive",
        "Worker, timer and store threads running (below ringway_sip_threads: the server is stopping).",
        &[],
        snap.threads_alive as f64,
    );
    text.gauge(
        "ringway_sip_threads",
        "Worker, timer and store threads started.",
        &[],
        snap.threads_started as f64,
    );
    text.counter(
        "ringway_sip_thread_panics_total",
        "Threads ended by a panic (each stops the whole server).",
        &[],
        snap.threads_panicked as u64,
    );
}

/// The shared location store's counters and latencies.
fn location_metrics(text: &mut PromText, location: &super::LocationSnapshot) {
    let counts = &location.counts;
    for (kind, count) in [
        ("register", counts.registers),
        ("lookup", counts.lookups),
        ("remove_path", counts.removals),
    ] {
        text.counter(
            "ringway_sip_location_queries_total",
            "Queries sent to the shared location store, by kind.",
            &[("kind", kind)],
            count,
        );
    }
    for (reason, count) in [
        ("connect", counts.connect_failures),
        ("backoff", counts.skipped_backoff),
        ("timeout", counts.timeouts),
        ("io", counts.io_errors),
        ("server", counts.server_errors),
        ("bad_reply", counts.bad_replies),
        ("queue_wait", counts.expired_in_queue),
    ] {
        text.counter(
            "ringway_sip_location_failures_total",
            "Shared location store queries answered as unavailable, by reason.",
            &[("reason", reason)],
            count,
        );
    }
    text.counter(
        "ringway_sip_location_reconnects_total",
        "Connections to the shared location store made after a failure.",
        &[],
        counts.reconnects,
    );
    text.gauge(
        "ringway_sip_location_up",
        "1 if the last connection attempt or command to the shared store succeeded.",
        &[],
        if counts.up { 1.0 } else { 0.0 },
    );
    for (kind, latency) in [
        ("register", &location.latency.register),
        ("lookup", &location.latency.lookup),
    ] {
        text.histogram(
            "ringway_sip_location_store_seconds",
            "Time of one shared location store call (round trip).",
            &[("kind", kind)],
            &latency.store,
        );
        text.histogram(
            "ringway_sip_location_added_seconds",
            "Receive to resumed and sent: what the shared store adds to a request.",
            &[("kind", kind)],
            &latency.added,
        );
    }
}
