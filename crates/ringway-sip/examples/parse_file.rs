//! Parse SIP messages from files and print a summary (debugging aid).
fn main() {
    for p in std::env::args().skip(1) {
        let b = std::fs::read(&p).expect("read");
        match ringway_sip::SipMsg::parse(&b) {
            Ok(m) => println!(
                "{p}: OK {} cid={:?} cseq={:?} via={:?} mf={:?} body={}",
                m.start_line(),
                m.call_id(),
                m.cseq(),
                m.top_via().map(|v| (v.host, v.port, v.branch)),
                m.max_forwards(),
                m.body().len()
            ),
            Err(e) => println!("{p}: ERR {e} (status {})", e.status()),
        }
    }
}
