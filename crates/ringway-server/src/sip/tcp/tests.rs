//! The connection table's indexes under opens and closes.

use super::*;

impl Table {
    /// Every index agrees with the connections open: each is under its
    /// peer address once, each alias names an open connection that
    /// took it, the per-IP counts are the accepted connections'.
    fn assert_consistent(&self) {
        let mut indexed = 0;
        for (peer, conns) in &self.by_peer {
            for id in std::iter::once(&conns.first).chain(&conns.others) {
                let conn = self.by_id.get(id).expect("an indexed connection is open");
                assert_eq!(conn.peer, *peer);
                indexed += 1;
            }
        }
        assert_eq!(
            indexed,
            self.by_id.len(),
            "each connection once by its peer"
        );
        for ((transport, addr), id) in &self.by_alias {
            let conn = self.by_id.get(id).expect("an alias of an open connection");
            assert_eq!((conn.transport, conn.alias.get()), (*transport, Some(addr)));
        }
        let mut per_ip: HashMap<IpAddr, usize> = HashMap::new();
        for conn in self.by_id.values().filter(|conn| conn.inbound) {
            *per_ip.entry(conn.peer.ip()).or_default() += 1;
        }
        assert_eq!(per_ip, self.per_ip);
    }
}

/// Closing a connection takes it out of every index at once (no scan
/// of the table): the next connection to the same address takes its
/// place, its alias and its source IP's count go, its flow is gone and
/// the close hook hears of it once.
#[test]
fn closing_keeps_every_index_consistent() {
    let poll = mio::Poll::new().unwrap();
    let connections = Connections::new(
        TcpConfig::default(),
        vec![poll.registry().try_clone().unwrap()],
        None,
        WsSettings::default(),
        vec![Transport::Tcp],
    );
    let closed = Arc::new(Mutex::new(Vec::new()));
    let heard = closed.clone();
    connections.set_on_close(Box::new(move |flow, _| lock(&heard).push(flow)));
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let to = server.local_addr().unwrap();
    // Two connections we open to one address, and one we accept.
    let (a, b) = {
        let mut table = lock(&connections.table);
        let a = connections
            .connect(&mut table, to, Transport::Tcp, 0)
            .unwrap();
        let b = connections
            .connect(&mut table, to, Transport::Tcp, 0)
            .unwrap();
        table.assert_consistent();
        (a, b)
    };
    let client = std::net::TcpStream::connect(to).unwrap();
    // The server's ends of a and b come first in its queue.
    let mut server_ends = Vec::new();
    let (accepted, peer) = loop {
        let (stream, from) = server.accept().unwrap();
        if from == client.local_addr().unwrap() {
            break (stream, from);
        }
        server_ends.push(stream);
    };
    accepted.set_nonblocking(true).unwrap();
    connections.adopt(TcpStream::from_std(accepted), peer, Transport::Tcp, 0);
    let c = lock(&connections.table).by_peer.get(&peer).map(|p| p.first);
    let c = connections
        .get(c.expect("the accepted connection"))
        .unwrap();
    let alias = SocketAddr::new(peer.ip(), 5099);
    assert!(connections.alias(&c, Transport::Tcp, alias));
    lock(&connections.table).assert_consistent();
    assert_eq!(connections.open(), 3);

    // The first of the two to one address goes: the other takes over.
    connections.close(&a, CloseReason::PeerClosed);
    {
        let table = lock(&connections.table);
        table.assert_consistent();
        assert_eq!(table.by_peer[&to].first, b.id);
    }
    assert!(!connections.is_open(FlowId(a.id)));
    assert!(connections.is_open(FlowId(b.id)));
    // The accepted one: its alias and its IP's count go with it.
    connections.close(&c, CloseReason::Idle);
    {
        let table = lock(&connections.table);
        table.assert_consistent();
        assert!(table.by_alias.is_empty());
        assert!(table.per_ip.is_empty());
        assert!(!table.by_peer.contains_key(&peer));
    }
    // Closing twice changes nothing; the last one empties the table.
    connections.close(&c, CloseReason::Idle);
    connections.close(&b, CloseReason::Shutdown);
    let table = lock(&connections.table);
    table.assert_consistent();
    assert!(table.by_id.is_empty() && table.by_peer.is_empty());
    drop(table);
    assert_eq!(
        *lock(&closed),
        [FlowId(a.id), FlowId(c.id), FlowId(b.id)],
        "the hook hears each close once"
    );
    assert_eq!(connections.snapshot().open, 0);
    drop((client, server_ends));
}
