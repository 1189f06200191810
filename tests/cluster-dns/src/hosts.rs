//! The CoreDNS mode's answers: the `hosts` entries of a Corefile's server
//! blocks, as CoreDNS's hosts plugin gives them, without I/O (unit tested
//! without a network).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, AAAA, PTR};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::corefile::{Corefile, ServerBlock};
use crate::resolver::Answer;

/// The TTL of every record: CoreDNS's hosts plugin's default.
pub const HOSTS_TTL: u32 = 3600;

/// One server block's names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Zone {
    /// Lowercase, fully qualified.
    apex: Name,
    /// The `log` plugin.
    log: bool,
    /// Name -> its addresses, in the order of the entries.
    addresses: HashMap<Name, Vec<IpAddr>>,
    /// Reverse name of an address -> the names it has, in order.
    pointers: HashMap<Name, Vec<Name>>,
}

fn push_new<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

impl Zone {
    fn new(block: &ServerBlock) -> Self {
        let mut zone = Zone {
            apex: block.zone.clone(),
            log: block.log,
            addresses: HashMap::new(),
            pointers: HashMap::new(),
        };
        for entry in block.hosts.iter().flat_map(|hosts| &hosts.entries) {
            for name in &entry.names {
                push_new(zone.addresses.entry(name.clone()).or_default(), entry.ip);
                push_new(
                    zone.pointers.entry(Name::from(entry.ip)).or_default(),
                    name.clone(),
                );
            }
        }
        zone
    }
}

/// The server blocks of one port: a question goes to the block of the
/// longest zone holding its name, as CoreDNS routes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsResolver {
    /// Longest zone first.
    zones: Vec<Zone>,
}

impl HostsResolver {
    /// The resolver of these blocks (those of one port).
    pub fn new<'a>(blocks: impl IntoIterator<Item = &'a ServerBlock>) -> Self {
        let mut zones: Vec<Zone> = blocks.into_iter().map(Zone::new).collect();
        zones.sort_by_key(|zone| std::cmp::Reverse(zone.apex.num_labels()));
        HostsResolver { zones }
    }

    /// One resolver per port of the Corefile, by port.
    pub fn per_port(corefile: &Corefile) -> BTreeMap<u16, HostsResolver> {
        let mut by_port: BTreeMap<u16, Vec<&ServerBlock>> = BTreeMap::new();
        for block in &corefile.blocks {
            by_port.entry(block.port).or_default().push(block);
        }
        by_port
            .into_iter()
            .map(|(port, blocks)| (port, HostsResolver::new(blocks)))
            .collect()
    }

    fn zone_of(&self, qname: &Name) -> Option<&Zone> {
        let mut lower = qname.to_lowercase();
        lower.set_fqdn(true);
        self.zones.iter().find(|zone| zone.apex.zone_of(&lower))
    }

    /// The answer to `qname` / `qtype` / `qclass`. Names compare without
    /// case; answer records are owned by `qname` as asked.
    pub fn answer(&self, qname: &Name, qtype: RecordType, qclass: DNSClass) -> Answer {
        let Some(zone) = self.zone_of(qname) else {
            return Answer::refused();
        };
        // Only Internet-class data, and no zone transfers.
        if qclass != DNSClass::IN || matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Answer::refused();
        }
        let mut lower = qname.to_lowercase();
        lower.set_fqdn(true);
        let addresses = zone.addresses.get(&lower);
        let pointers = zone.pointers.get(&lower);
        if addresses.is_none() && pointers.is_none() {
            // No SOA to add: the hosts plugin has none.
            return Answer::bare(ResponseCode::NXDomain, true);
        }
        let record = |rdata: RData| Record::from_rdata(qname.clone(), HOSTS_TTL, rdata);
        let mut answers = Vec::new();
        for ip in addresses.into_iter().flatten() {
            match ip {
                IpAddr::V4(v4) if qtype == RecordType::A => answers.push(record(RData::A(A(*v4)))),
                IpAddr::V6(v6) if qtype == RecordType::AAAA => {
                    answers.push(record(RData::AAAA(AAAA(*v6))))
                }
                _ => {}
            }
        }
        if qtype == RecordType::PTR {
            for name in pointers.into_iter().flatten() {
                answers.push(record(RData::PTR(PTR(name.clone()))));
            }
        }
        // Without records of the type: NODATA.
        Answer {
            answers,
            ..Answer::bare(ResponseCode::NoError, true)
        }
    }

    /// Whether a query of `qname` is logged: its block has `log`.
    pub fn logs(&self, qname: &Name) -> bool {
        self.zone_of(qname).is_some_and(|zone| zone.log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The e2e suite's server, plus IPv6, two names on one address, one
    /// name on two addresses.
    const COREFILE: &str = ". {\n\thosts {\n\t\t1.1.1.1 notexistname.resolv.conf.local\
        \n\t\t192.0.2.123 my.test other.test\n\t\t2001:db8::29 my.test\n\t}\n\tlog\n}";

    fn resolver(text: &str) -> HostsResolver {
        let corefile = Corefile::parse(text).unwrap();
        let mut per_port = HostsResolver::per_port(&corefile);
        assert_eq!(per_port.len(), 1);
        per_port.remove(&53).unwrap()
    }

    fn name(text: &str) -> Name {
        Name::from_ascii(text).unwrap()
    }

    fn ask(resolver: &HostsResolver, qname: &str, qtype: RecordType) -> Answer {
        resolver.answer(&name(qname), qtype, DNSClass::IN)
    }

    fn data(answer: &Answer) -> Vec<String> {
        answer.answers.iter().map(|r| r.data.to_string()).collect()
    }

    fn assert_records(answer: &Answer, owner: &str, qtype: RecordType, expected: &[&str]) {
        assert_eq!(answer.response_code, ResponseCode::NoError, "{answer:?}");
        assert!(answer.authoritative);
        assert_eq!(data(answer), expected);
        for record in &answer.answers {
            assert_eq!(record.name.to_string(), owner);
            assert_eq!(record.record_type(), qtype);
            assert_eq!(record.ttl, HOSTS_TTL);
            assert_eq!(record.dns_class, DNSClass::IN);
        }
        assert!(answer.authorities.is_empty() && answer.additionals.is_empty());
    }

    fn assert_empty(answer: &Answer, response_code: ResponseCode, authoritative: bool) {
        assert_eq!(answer.response_code, response_code, "{answer:?}");
        assert_eq!(answer.authoritative, authoritative);
        assert!(answer.answers.is_empty() && answer.authorities.is_empty());
    }

    #[test]
    fn the_e2e_name_has_its_address_with_the_hosts_ttl() {
        let resolver = resolver(COREFILE);
        let answer = ask(&resolver, "notexistname.resolv.conf.local.", RecordType::A);
        assert_records(
            &answer,
            "notexistname.resolv.conf.local.",
            RecordType::A,
            &["1.1.1.1"],
        );
        assert_eq!(HOSTS_TTL, 3600);
    }

    #[test]
    fn names_match_without_case_absolute_or_not_and_keep_the_asked_case() {
        let resolver = resolver(COREFILE);
        let answer = ask(&resolver, "NotExistName.Resolv.CONF.local", RecordType::A);
        assert_records(
            &answer,
            "NotExistName.Resolv.CONF.local",
            RecordType::A,
            &["1.1.1.1"],
        );
    }

    #[test]
    fn a_and_aaaa_answer_their_own_family() {
        let resolver = resolver(COREFILE);
        assert_records(
            &ask(&resolver, "my.test.", RecordType::A),
            "my.test.",
            RecordType::A,
            &["192.0.2.123"],
        );
        assert_records(
            &ask(&resolver, "my.test.", RecordType::AAAA),
            "my.test.",
            RecordType::AAAA,
            &["2001:db8::29"],
        );
        assert_records(
            &ask(&resolver, "other.test.", RecordType::A),
            "other.test.",
            RecordType::A,
            &["192.0.2.123"],
        );
    }

    #[test]
    fn addresses_have_ptr_records_to_each_of_their_names() {
        let resolver = resolver(COREFILE);
        assert_records(
            &ask(&resolver, "123.2.0.192.in-addr.arpa.", RecordType::PTR),
            "123.2.0.192.in-addr.arpa.",
            RecordType::PTR,
            &["my.test.", "other.test."],
        );
        assert_records(
            &ask(&resolver, "1.1.1.1.in-addr.arpa.", RecordType::PTR),
            "1.1.1.1.in-addr.arpa.",
            RecordType::PTR,
            &["notexistname.resolv.conf.local."],
        );
        let v6 = Name::from("2001:db8::29".parse::<IpAddr>().unwrap()).to_string();
        assert!(v6.ends_with(".ip6.arpa."), "{v6}");
        assert_records(
            &ask(&resolver, &v6, RecordType::PTR),
            &v6,
            RecordType::PTR,
            &["my.test."],
        );
        // An address without an entry: NXDOMAIN.
        assert_empty(
            &ask(&resolver, "8.8.8.8.in-addr.arpa.", RecordType::PTR),
            ResponseCode::NXDomain,
            true,
        );
    }

    #[test]
    fn known_names_asked_another_type_are_nodata() {
        let resolver = resolver(COREFILE);
        for (qname, qtype) in [
            ("notexistname.resolv.conf.local.", RecordType::AAAA),
            ("notexistname.resolv.conf.local.", RecordType::TXT),
            ("notexistname.resolv.conf.local.", RecordType::PTR),
            ("notexistname.resolv.conf.local.", RecordType::ANY),
            ("my.test.", RecordType::MX),
            ("1.1.1.1.in-addr.arpa.", RecordType::A),
        ] {
            assert_empty(&ask(&resolver, qname, qtype), ResponseCode::NoError, true);
        }
    }

    #[test]
    fn other_names_are_nxdomain_in_the_root_zone() {
        let resolver = resolver(COREFILE);
        for qname in [
            "notexistname.",
            "resolv.conf.local.",
            "x.notexistname.resolv.conf.local.",
            "kubernetes.default.svc.cluster.local.",
            "example.com.",
        ] {
            assert_empty(
                &ask(&resolver, qname, RecordType::A),
                ResponseCode::NXDomain,
                true,
            );
        }
    }

    #[test]
    fn names_outside_the_zone_other_classes_and_transfers_are_refused() {
        let resolver = resolver(
            "acme.local {\n  hosts {\n    1.1.1.1 abc.acme.local\n    3.3.3.3 widget.local\n  }\n}",
        );
        assert_records(
            &ask(&resolver, "abc.acme.local.", RecordType::A),
            "abc.acme.local.",
            RecordType::A,
            &["1.1.1.1"],
        );
        assert_empty(
            &ask(&resolver, "nope.acme.local.", RecordType::A),
            ResponseCode::NXDomain,
            true,
        );
        // Outside the block's zone, the entry included; and the reverse
        // zones are not the block's either.
        for (qname, qtype) in [
            ("widget.local.", RecordType::A),
            ("example.com.", RecordType::A),
            ("1.1.1.1.in-addr.arpa.", RecordType::PTR),
            (".", RecordType::NS),
        ] {
            assert_empty(&ask(&resolver, qname, qtype), ResponseCode::Refused, false);
        }
        let chaos = resolver.answer(&name("abc.acme.local."), RecordType::A, DNSClass::CH);
        assert_empty(&chaos, ResponseCode::Refused, false);
        assert_empty(
            &ask(&resolver, "acme.local.", RecordType::AXFR),
            ResponseCode::Refused,
            false,
        );
    }

    #[test]
    fn the_longest_zone_of_a_port_answers_and_decides_the_log() {
        let corefile = Corefile::parse(
            ". {\n  hosts {\n    1.1.1.1 a.example.org\n  }\n  log\n}\n\
             example.org {\n  hosts {\n    2.2.2.2 b.example.org\n  }\n}\n\
             .:5353 {\n  hosts {\n    3.3.3.3 a.example.org\n  }\n  log\n}\n",
        )
        .unwrap();
        let per_port = HostsResolver::per_port(&corefile);
        assert_eq!(per_port.keys().copied().collect::<Vec<_>>(), [53, 5353]);
        let port_53 = &per_port[&53];
        // example.org's block has it: its entries only, and no log.
        assert_empty(
            &ask(port_53, "a.example.org.", RecordType::A),
            ResponseCode::NXDomain,
            true,
        );
        assert_eq!(
            data(&ask(port_53, "b.example.org.", RecordType::A)),
            ["2.2.2.2"]
        );
        assert!(!port_53.logs(&name("b.example.org.")));
        assert!(port_53.logs(&name("example.com.")));
        assert!(port_53.logs(&name("A.Example.COM")));
        assert_eq!(
            data(&ask(&per_port[&5353], "a.example.org.", RecordType::A)),
            ["3.3.3.3"]
        );
    }

    #[test]
    fn no_hosts_means_nxdomain_and_repeats_are_answered_once() {
        let no_hosts = resolver(". {\n  log\n}");
        assert_empty(
            &ask(&no_hosts, "a.example.", RecordType::A),
            ResponseCode::NXDomain,
            true,
        );
        let repeated = resolver(
            ". {\n  hosts {\n    1.1.1.1 a.example a.example\n    1.1.1.1 A.example.\n    1.1.1.2 a.example\n  }\n}",
        );
        assert_eq!(
            data(&ask(&repeated, "a.example.", RecordType::A)),
            ["1.1.1.1", "1.1.1.2"]
        );
        assert_eq!(
            data(&ask(&repeated, "1.1.1.1.in-addr.arpa.", RecordType::PTR)),
            ["a.example."]
        );
    }
}
