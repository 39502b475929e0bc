//! Locating a SIP server (RFC 3263 §4) as a sans-IO state machine: a
//! [`Lookup`] says which question it needs next ([`Lookup::question`]),
//! takes the answer ([`Lookup::answer`]) and, when it has none left, gives
//! the next hops in the order to try them ([`Lookup::targets`]).
//!
//! - A host that is an IP literal is the target (port 5060 unless given).
//! - A host with a port: A/AAAA only (§4.2).
//! - Otherwise NAPTR: the records with flag `S` and service `SIP+D2U`
//!   (we send over UDP), by order then preference, each replacement asked
//!   for SRV until one gives targets; with no usable NAPTR, SRV
//!   `_sip._udp.<host>`; with no SRV either, A/AAAA of the host, port 5060.
//! - SRV targets are ordered by priority and, within one priority, by
//!   RFC 2782's weighted random selection ([`order_srv`]) with the caller's
//!   random source (seeded in tests); each target's addresses follow in
//!   A, then AAAA order (the families the caller can send to).
//!
//! Bounds: at most [`MAX_TARGETS`] SRV targets are looked up and at most
//! [`MAX_QUESTIONS`] questions asked per lookup, whatever the answers say.

use super::wire::{Record, RecordData, RecordType};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

/// SRV targets resolved per lookup at most.
pub const MAX_TARGETS: usize = 8;
/// Questions one lookup asks at most.
pub const MAX_QUESTIONS: usize = 24;
/// The SIP port (RFC 3261 19.1.2).
const SIP_PORT: u16 = 5060;

/// A question: a name and a record type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Question {
    /// The name (lower case, no trailing dot).
    pub name: String,
    /// The type.
    pub record_type: RecordType,
}

/// What came back for a question.
#[derive(Clone, Copy, Debug)]
pub enum Answer<'a> {
    /// Records (those of other names or types are ignored, a CNAME chain
    /// in the answer is followed).
    Records(&'a [Record]),
    /// The name does not exist, or has no record of that type.
    NoData,
    /// No answer (timeout, server failure, a refused response).
    Failed,
}

/// A source of randomness for SRV weights.
pub trait Random {
    /// A number in `0..=max`.
    fn up_to(&mut self, max: u32) -> u32;
}

/// xorshift64* — not cryptographic; SRV weights only need spread.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (0 is replaced).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }
}

impl Random for XorShift {
    fn up_to(&mut self, max: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let value = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((value >> 32) % (u64::from(max) + 1)) as u32
    }
}

/// Why a lookup gave no target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupError {
    /// The name resolved to nothing we can send to.
    NoTargets,
    /// Some answer failed (timeout, server failure) and nothing resolved.
    Failed,
}

/// The transport a lookup is for (RFC 3263 4.1: the NAPTR service and
/// the SRV prefix that go with it, and the port of a bare A/AAAA answer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Service {
    /// `SIP+D2U`, `_sip._udp`, port 5060.
    #[default]
    Udp,
    /// `SIP+D2T`, `_sip._tcp`, port 5060.
    Tcp,
    /// `SIPS+D2T`, `_sips._tcp`, port 5061.
    Tls,
}

impl Service {
    /// The service of a transport (WebSocket next hops are reached as
    /// their stream transport).
    pub fn of(transport: ringway_sip::Transport) -> Service {
        use ringway_sip::Transport;
        match transport {
            Transport::Udp => Service::Udp,
            Transport::Tcp | Transport::Ws => Service::Tcp,
            Transport::Tls | Transport::Wss => Service::Tls,
        }
    }

    /// The NAPTR service field.
    pub fn naptr(self) -> &'static str {
        match self {
            Service::Udp => "SIP+D2U",
            Service::Tcp => "SIP+D2T",
            Service::Tls => "SIPS+D2T",
        }
    }

    /// The SRV name prefix.
    pub fn srv_prefix(self) -> &'static str {
        match self {
            Service::Udp => "_sip._udp",
            Service::Tcp => "_sip._tcp",
            Service::Tls => "_sips._tcp",
        }
    }

    /// The port when no SRV record gives one.
    pub fn default_port(self) -> u16 {
        match self {
            Service::Tls => 5061,
            _ => SIP_PORT,
        }
    }
}

/// What a question is for.
#[derive(Clone, Debug)]
enum Purpose {
    Naptr,
    Srv,
    Address { port: u16 },
}

/// One RFC 3263 next-hop lookup.
#[derive(Debug)]
pub struct Lookup {
    host: String,
    ipv4: bool,
    ipv6: bool,
    pending: VecDeque<(Question, Purpose)>,
    targets: Vec<SocketAddr>,
    asked: usize,
    failed: bool,
    service: Service,
}

impl Lookup {
    /// A lookup of `host` (a name or an IP literal) with an explicit `port`
    /// or none, for a sender that can reach IPv4 (`ipv4`) and/or IPv6.
    pub fn new(host: &str, port: Option<u16>, ipv4: bool, ipv6: bool) -> Lookup {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let mut lookup = Lookup {
            host,
            ipv4,
            ipv6,
            pending: VecDeque::new(),
            targets: Vec::new(),
            asked: 0,
            failed: false,
            service: Service::Udp,
        };
        if let Ok(ip) = lookup.host.parse::<IpAddr>() {
            lookup.add_target(SocketAddr::new(ip, port.unwrap_or(SIP_PORT)));
        } else if let Some(port) = port {
            let host = lookup.host.clone();
            lookup.ask_addresses(&host, port);
        } else {
            let question = Question {
                name: lookup.host.clone(),
                record_type: RecordType::Naptr,
            };
            lookup.pending.push_back((question, Purpose::Naptr));
        }
        lookup
    }

    /// The same lookup for `service` (a transport other than UDP): its
    /// NAPTR service, SRV prefix and default port. Call before any answer.
    pub fn for_service(mut self, service: Service) -> Lookup {
        self.service = service;
        self
    }

    /// The question to ask next; `None` when the lookup is done.
    pub fn question(&self) -> Option<&Question> {
        self.pending.front().map(|(q, _)| q)
    }

    /// The answer to [`Lookup::question`]; `random` orders SRV weights.
    pub fn answer(&mut self, answer: Answer<'_>, random: &mut dyn Random) {
        let Some((question, purpose)) = self.pending.pop_front() else {
            return;
        };
        self.asked += 1;
        let records = match answer {
            Answer::Records(records) => chase(records, &question),
            Answer::NoData => Vec::new(),
            Answer::Failed => {
                self.failed = true;
                Vec::new()
            }
        };
        match purpose {
            Purpose::Naptr => self.on_naptr(&records),
            Purpose::Srv => self.on_srv(&records, random),
            Purpose::Address { port } => {
                for data in records {
                    match data {
                        RecordData::A(ip) => {
                            self.add_target(SocketAddr::new(IpAddr::V4(*ip), port))
                        }
                        RecordData::Aaaa(ip) => {
                            self.add_target(SocketAddr::new(IpAddr::V6(*ip), port))
                        }
                        _ => {}
                    }
                }
            }
        }
        if self.asked >= MAX_QUESTIONS {
            self.pending.clear();
        }
    }

    /// The next hops in the order to try them, once [`Lookup::question`]
    /// is `None`.
    pub fn targets(&self) -> Result<Vec<SocketAddr>, LookupError> {
        match (self.targets.is_empty(), self.failed) {
            (false, _) => Ok(self.targets.clone()),
            (true, true) => Err(LookupError::Failed),
            (true, false) => Err(LookupError::NoTargets),
        }
    }

    fn on_naptr(&mut self, records: &[&RecordData]) {
        let mut usable: Vec<(u16, u16, &str)> = records
            .iter()
            .filter_map(|data| match data {
                RecordData::Naptr {
                    order,
                    preference,
                    flags,
                    services,
                    replacement,
                } if flags.eq_ignore_ascii_case("s")
                    && services.eq_ignore_ascii_case(self.service.naptr())
                    && !replacement.is_empty() =>
                {
                    Some((*order, *preference, replacement.as_str()))
                }
                _ => None,
            })
            .collect();
        usable.sort();
        let names: Vec<String> = if usable.is_empty() {
            vec![format!("{}.{}", self.service.srv_prefix(), self.host)]
        } else {
            usable.iter().map(|(_, _, name)| name.to_string()).collect()
        };
        for name in names.into_iter().take(MAX_TARGETS) {
            let question = Question {
                name,
                record_type: RecordType::Srv,
            };
            self.pending.push_back((question, Purpose::Srv));
        }
    }

    fn on_srv(&mut self, records: &[&RecordData], random: &mut dyn Random) {
        let srv: Vec<SrvRecord> = records
            .iter()
            .filter_map(|data| match data {
                RecordData::Srv {
                    priority,
                    weight,
                    port,
                    target,
                } => Some(SrvRecord {
                    priority: *priority,
                    weight: *weight,
                    port: *port,
                    target: target.clone(),
                }),
                _ => None,
            })
            .collect();
        let more_srv = self
            .pending
            .iter()
            .any(|(_, purpose)| matches!(purpose, Purpose::Srv));
        if srv.is_empty() {
            if !more_srv {
                // §4.2: no SRV records: the host's addresses, port 5060.
                let host = self.host.clone();
                self.ask_addresses(&host, self.service.default_port());
            }
            return;
        }
        // The first SRV name with records decides; the rest are not asked.
        self.pending
            .retain(|(_, purpose)| !matches!(purpose, Purpose::Srv));
        // A single "." target: the service is decidedly not available.
        for record in order_srv(srv, random)
            .into_iter()
            .filter(|r| !r.target.is_empty())
            .take(MAX_TARGETS)
        {
            self.ask_addresses(&record.target, record.port);
        }
    }

    fn ask_addresses(&mut self, name: &str, port: u16) {
        let types = [(self.ipv4, RecordType::A), (self.ipv6, RecordType::Aaaa)];
        for (_, record_type) in types.into_iter().filter(|(on, _)| *on) {
            let question = Question {
                name: name.to_string(),
                record_type,
            };
            self.pending
                .push_back((question, Purpose::Address { port }));
        }
    }

    fn add_target(&mut self, addr: SocketAddr) {
        let family_ok = if addr.is_ipv4() { self.ipv4 } else { self.ipv6 };
        if family_ok && !self.targets.contains(&addr) {
            self.targets.push(addr);
        }
    }
}

/// The data of `question`'s type owned by its name, following a CNAME
/// chain within `records` (at most 8 links).
fn chase<'r>(records: &'r [Record], question: &Question) -> Vec<&'r RecordData> {
    let mut name = question.name.as_str();
    for _ in 0..8 {
        let alias = records.iter().find_map(|r| match &r.data {
            RecordData::Cname(to) if r.name == name => Some(to.as_str()),
            _ => None,
        });
        match alias {
            Some(to) if question.record_type != RecordType::Cname => name = to,
            _ => break,
        }
    }
    records
        .iter()
        .filter(|r| r.name == name && r.data.record_type() == question.record_type)
        .map(|r| &r.data)
        .collect()
}

/// One SRV record's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvRecord {
    /// Lower first.
    pub priority: u16,
    /// Share within the priority.
    pub weight: u16,
    /// Port.
    pub port: u16,
    /// Target host (empty: the root).
    pub target: String,
}

/// RFC 2782's order: priorities ascending; within one, repeatedly pick a
/// record with probability weight/(sum+1) (zero weights first in the list:
/// they are picked only on a draw of 0, and in list order when all are 0).
pub fn order_srv(mut records: Vec<SrvRecord>, random: &mut dyn Random) -> Vec<SrvRecord> {
    records.sort_by_key(|r| (r.priority, r.weight != 0));
    let mut ordered = Vec::with_capacity(records.len());
    let mut rest = records.as_slice();
    while let Some(first) = rest.first() {
        let same = rest
            .iter()
            .take_while(|r| r.priority == first.priority)
            .count();
        let (group, tail) = rest.split_at(same);
        let mut group = group.to_vec();
        while !group.is_empty() {
            let sum: u32 = group.iter().map(|r| u32::from(r.weight)).sum();
            let pick = random.up_to(sum);
            let mut running = 0u32;
            let index = group
                .iter()
                .position(|r| {
                    running += u32::from(r.weight);
                    running >= pick
                })
                .unwrap_or(0);
            ordered.push(group.remove(index));
        }
        rest = tail;
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn rec(name: &str, data: RecordData) -> Record {
        Record {
            name: name.into(),
            ttl: 60,
            data,
        }
    }

    fn srv(priority: u16, weight: u16, port: u16, target: &str) -> RecordData {
        RecordData::Srv {
            priority,
            weight,
            port,
            target: target.into(),
        }
    }

    fn a(last: u8) -> RecordData {
        RecordData::A(Ipv4Addr::new(10, 0, 0, last))
    }

    /// Drive `lookup` with answers from `zone` (name, type → records).
    fn run(mut lookup: Lookup, zone: &[Record], seed: u64) -> (Vec<Question>, Lookup) {
        let mut asked = Vec::new();
        let mut random = XorShift::new(seed);
        while let Some(q) = lookup.question().cloned() {
            let records: Vec<Record> = zone
                .iter()
                .filter(|r| r.name == q.name && r.data.record_type() == q.record_type)
                .cloned()
                .collect();
            let answer = if records.is_empty() {
                Answer::NoData
            } else {
                Answer::Records(&records)
            };
            lookup.answer(answer, &mut random);
            asked.push(q);
        }
        (asked, lookup)
    }

    #[test]
    fn naptr_then_srv_by_priority_then_addresses() {
        let zone = [
            rec(
                "sip.test",
                RecordData::Naptr {
                    order: 10,
                    preference: 10,
                    flags: "s".into(),
                    services: "SIP+D2T".into(),
                    replacement: "_sip._tcp.sip.test".into(),
                },
            ),
            rec(
                "sip.test",
                RecordData::Naptr {
                    order: 20,
                    preference: 10,
                    flags: "S".into(),
                    services: "SIP+D2U".into(),
                    replacement: "_sip._udp.sip.test".into(),
                },
            ),
            rec("_sip._udp.sip.test", srv(20, 0, 5080, "b.sip.test")),
            rec("_sip._udp.sip.test", srv(10, 0, 5070, "a.sip.test")),
            rec("a.sip.test", a(1)),
            rec("b.sip.test", a(2)),
        ];
        let (asked, lookup) = run(Lookup::new("SIP.test", None, true, false), &zone, 1);
        let names: Vec<_> = asked
            .iter()
            .map(|q| format!("{} {}", q.record_type, q.name))
            .collect();
        assert_eq!(
            names,
            [
                "NAPTR sip.test",
                "SRV _sip._udp.sip.test",
                "A a.sip.test",
                "A b.sip.test"
            ]
        );
        assert_eq!(
            lookup.targets().unwrap(),
            vec![
                "10.0.0.1:5070".parse().unwrap(),
                "10.0.0.2:5080".parse().unwrap()
            ]
        );
    }

    #[test]
    fn fallbacks_srv_without_naptr_and_a_without_srv() {
        let zone = [
            rec("_sip._udp.s.test", srv(1, 0, 5999, "t.test")),
            rec("t.test", a(9)),
            rec("plain.test", a(7)),
        ];
        let (_, lookup) = run(Lookup::new("s.test", None, true, true), &zone, 1);
        assert_eq!(
            lookup.targets().unwrap(),
            vec!["10.0.0.9:5999".parse().unwrap()]
        );
        let (asked, lookup) = run(Lookup::new("plain.test", None, true, false), &zone, 1);
        assert_eq!(asked.len(), 3, "NAPTR, SRV, A");
        assert_eq!(
            lookup.targets().unwrap(),
            vec!["10.0.0.7:5060".parse().unwrap()]
        );
        // An explicit port: addresses only.
        let (asked, lookup) = run(Lookup::new("plain.test", Some(7000), true, false), &zone, 1);
        assert_eq!(asked.len(), 1);
        assert_eq!(
            lookup.targets().unwrap(),
            vec!["10.0.0.7:7000".parse().unwrap()]
        );
        // A literal: no question at all.
        let lookup = Lookup::new("[::1]", None, true, true);
        assert!(lookup.question().is_none());
        assert_eq!(
            lookup.targets().unwrap(),
            vec!["[::1]:5060".parse().unwrap()]
        );
        let (_, lookup) = run(Lookup::new("none.test", None, true, false), &zone, 1);
        assert_eq!(lookup.targets(), Err(LookupError::NoTargets));
    }

    #[test]
    fn failures_are_told_apart_from_no_data() {
        let mut lookup = Lookup::new("x.test", Some(5060), true, false);
        lookup.answer(Answer::Failed, &mut XorShift::new(1));
        assert_eq!(lookup.targets(), Err(LookupError::Failed));
    }

    #[test]
    fn cname_chains_are_followed_and_bounded() {
        let records = [
            rec("a.test", RecordData::Cname("b.test".into())),
            rec("b.test", a(3)),
        ];
        let mut lookup = Lookup::new("a.test", Some(1), true, false);
        lookup.answer(Answer::Records(&records), &mut XorShift::new(1));
        assert_eq!(
            lookup.targets().unwrap(),
            vec!["10.0.0.3:1".parse().unwrap()]
        );
        let looped = [
            rec("a.test", RecordData::Cname("b.test".into())),
            rec("b.test", RecordData::Cname("a.test".into())),
        ];
        let mut lookup = Lookup::new("a.test", Some(1), true, false);
        lookup.answer(Answer::Records(&looped), &mut XorShift::new(1));
        assert_eq!(lookup.targets(), Err(LookupError::NoTargets));
    }

    #[test]
    fn srv_weights_spread_as_rfc_2782_says() {
        // Priority 1: weights 60/30/10 (and one zero); priority 2 last.
        let records = vec![
            SrvRecord {
                priority: 2,
                weight: 100,
                port: 4,
                target: "d".into(),
            },
            SrvRecord {
                priority: 1,
                weight: 60,
                port: 1,
                target: "a".into(),
            },
            SrvRecord {
                priority: 1,
                weight: 30,
                port: 2,
                target: "b".into(),
            },
            SrvRecord {
                priority: 1,
                weight: 10,
                port: 3,
                target: "c".into(),
            },
            SrvRecord {
                priority: 1,
                weight: 0,
                port: 5,
                target: "z".into(),
            },
        ];
        let mut random = XorShift::new(0x5eed);
        let mut first = [0u32; 6];
        for _ in 0..10_000 {
            let ordered = order_srv(records.clone(), &mut random);
            assert_eq!(ordered.last().unwrap().target, "d", "priority 2 last");
            first[usize::from(ordered[0].port)] += 1;
        }
        // Expected shares 60/30/10 %; the zero weight is first only when
        // the draw is 0: 1 in 101.
        assert!((5_700..6_300).contains(&first[1]), "{first:?}");
        assert!((2_700..3_300).contains(&first[2]), "{first:?}");
        assert!((800..1_200).contains(&first[3]), "{first:?}");
        assert!((40..200).contains(&first[5]), "{first:?}");
    }

    #[test]
    fn answers_never_make_a_lookup_ask_without_end() {
        // 40 SRV records and 40 NAPTRs: bounded questions.
        let mut zone: Vec<Record> = (0..40)
            .map(|i| rec("_sip._udp.big.test", srv(1, 1, 1, &format!("t{i}.test"))))
            .collect();
        zone.extend((0..40).map(|i| {
            rec(
                "big.test",
                RecordData::Naptr {
                    order: i,
                    preference: 0,
                    flags: "s".into(),
                    services: "SIP+D2U".into(),
                    replacement: format!("_sip._udp.n{i}.test"),
                },
            )
        }));
        let (asked, _) = run(Lookup::new("big.test", None, true, true), &zone, 1);
        assert!(asked.len() <= MAX_QUESTIONS, "{}", asked.len());
    }
}
