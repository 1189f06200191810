//! Answers to one question from one [`ClusterSnapshot`]: no I/O, no
//! clock, nothing but the snapshot, so every record kind is tested
//! without a network.

use std::net::IpAddr;

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::snapshot::{Apex, ClusterSnapshot, DNS_SCHEMA_VERSION, NameData};

/// CoreDNS's TTL for the schema version record.
const DNS_VERSION_TTL: u32 = 28800;
/// The SOA's timers, as CoreDNS sets them.
const SOA_REFRESH: i32 = 7200;
const SOA_RETRY: i32 = 1800;
const SOA_EXPIRE: i32 = 86400;
/// The SOA record's own TTL is the zone TTL, capped as CoreDNS caps it.
const SOA_MAX_TTL: u32 = 300;
/// ExternalName services pointing at each other are followed this far.
const MAX_CNAME_CHAIN: usize = 8;

/// What the server sends back for one question.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub response_code: ResponseCode,
    /// Set for every answer from our zones (AA), not for refusals.
    pub authoritative: bool,
    pub answers: Vec<Record>,
    /// The zone's SOA on NXDOMAIN and NODATA (negative caching, RFC 2308).
    pub authorities: Vec<Record>,
    /// The addresses of SRV targets.
    pub additionals: Vec<Record>,
}

impl Answer {
    pub(crate) fn bare(response_code: ResponseCode, authoritative: bool) -> Self {
        Answer {
            response_code,
            authoritative,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        }
    }

    /// A name outside our zones: there is no upstream to ask, by design.
    pub(crate) fn refused() -> Self {
        Self::bare(ResponseCode::Refused, false)
    }
}

/// The data of `<a-b-c-d>.<ns>.pod.<zone>` (any namespace, any address:
/// CoreDNS's `pods insecure`) and of `<ns>.pod.<zone>` (an empty
/// non-terminal); None for any other name under `pod.<zone>`.
fn pod_name_data(pod_zone: &Name, name: &Name) -> Option<NameData> {
    if !pod_zone.zone_of(name) {
        return None;
    }
    match name.num_labels() - pod_zone.num_labels() {
        1 => Some(NameData::default()),
        2 => {
            let label = std::str::from_utf8(name.iter().next()?).ok()?;
            Some(NameData {
                addresses: vec![dashed_ip(label)?],
                ..NameData::default()
            })
        }
        _ => None,
    }
}

/// `10-244-1-5` -> 10.244.1.5, `fd00--5` -> fd00::5 (CoreDNS's rule: three
/// dashes and no double dash is IPv4, anything else IPv6).
fn dashed_ip(label: &str) -> Option<IpAddr> {
    if label.matches('-').count() == 3 && !label.contains("--") {
        label.replace('-', ".").parse().ok()
    } else {
        label.replace('-', ":").parse().ok()
    }
}

impl ClusterSnapshot {
    /// The answer to `qname` / `qtype` / `qclass`. Names compare without
    /// case; answer records are owned by `qname` as asked.
    pub fn answer(&self, qname: &Name, qtype: RecordType, qclass: DNSClass) -> Answer {
        let mut lower = qname.to_lowercase();
        lower.set_fqdn(true);
        let Some(apex) = self.config.apex_of(&lower) else {
            return Answer::refused();
        };
        // Only Internet-class data, and no zone transfers.
        if qclass != DNSClass::IN || matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Answer::refused();
        }
        // Before the first lists nothing can be denied: let clients retry.
        if !self.synced {
            return Answer::bare(ResponseCode::ServFail, false);
        }
        self.lookup(qname, &lower, apex, qtype, 0)
    }

    fn lookup(
        &self,
        owner: &Name,
        lower: &Name,
        apex: &Apex,
        qtype: RecordType,
        chain: usize,
    ) -> Answer {
        let synthesized;
        let data = match self.names.get(lower) {
            Some(data) => data,
            None => match pod_name_data(self.config.pod(), lower) {
                Some(data) => {
                    synthesized = data;
                    &synthesized
                }
                None => return self.negative(ResponseCode::NXDomain, apex),
            },
        };
        if let Some(target) = &data.alias
            && !matches!(qtype, RecordType::CNAME | RecordType::ANY)
        {
            return self.follow_alias(owner, target, qtype, chain);
        }
        let answers = self.records_at(owner, lower, apex, data, qtype);
        if answers.is_empty() {
            return self.negative(ResponseCode::NoError, apex);
        }
        let additionals = self.srv_target_addresses(&answers);
        Answer {
            response_code: ResponseCode::NoError,
            authoritative: true,
            answers,
            authorities: Vec::new(),
            additionals,
        }
    }

    /// The CNAME, then what its target holds when the target is ours (we
    /// never ask anyone else: a client resolves an outside target itself).
    fn follow_alias(&self, owner: &Name, target: &Name, qtype: RecordType, chain: usize) -> Answer {
        let cname = Record::from_rdata(
            owner.clone(),
            self.config.ttl(),
            RData::CNAME(CNAME(target.clone())),
        );
        let mut target_lower = target.to_lowercase();
        target_lower.set_fqdn(true);
        let mut answer = match self.config.apex_of(&target_lower) {
            Some(target_apex) if chain < MAX_CNAME_CHAIN => {
                self.lookup(target, &target_lower, target_apex, qtype, chain + 1)
            }
            _ => Answer::bare(ResponseCode::NoError, true),
        };
        // RFC 6604: the code is the last name's; the chain leads the answer.
        answer.answers.insert(0, cname);
        answer
    }

    fn negative(&self, response_code: ResponseCode, apex: &Apex) -> Answer {
        Answer {
            authorities: vec![self.soa(&apex.name, apex)],
            ..Answer::bare(response_code, true)
        }
    }

    fn soa(&self, owner: &Name, apex: &Apex) -> Record {
        let ttl = self.config.ttl();
        let soa = SOA::new(
            apex.mname.clone(),
            apex.rname.clone(),
            self.serial,
            SOA_REFRESH,
            SOA_RETRY,
            SOA_EXPIRE,
            ttl,
        );
        Record::from_rdata(owner.clone(), ttl.min(SOA_MAX_TTL), RData::SOA(soa))
    }

    /// The records of `qtype` (every type for ANY) at a name that exists.
    fn records_at(
        &self,
        owner: &Name,
        lower: &Name,
        apex: &Apex,
        data: &NameData,
        qtype: RecordType,
    ) -> Vec<Record> {
        let wanted = |record_type: RecordType| qtype == RecordType::ANY || qtype == record_type;
        let ttl = self.config.ttl();
        let record = |rdata: RData| Record::from_rdata(owner.clone(), ttl, rdata);
        let mut records = Vec::new();
        if *lower == apex.name && wanted(RecordType::SOA) {
            records.push(self.soa(owner, apex));
        }
        if lower == self.config.dns_version() && wanted(RecordType::TXT) {
            let txt = TXT::new(vec![DNS_SCHEMA_VERSION.to_string()]);
            records.push(Record::from_rdata(
                owner.clone(),
                DNS_VERSION_TTL,
                RData::TXT(txt),
            ));
        }
        for ip in &data.addresses {
            match ip {
                IpAddr::V4(v4) if wanted(RecordType::A) => records.push(record(RData::A(A(*v4)))),
                IpAddr::V6(v6) if wanted(RecordType::AAAA) => {
                    records.push(record(RData::AAAA(AAAA(*v6))))
                }
                _ => {}
            }
        }
        if let Some(target) = &data.alias
            && wanted(RecordType::CNAME)
        {
            records.push(record(RData::CNAME(CNAME(target.clone()))));
        }
        if wanted(RecordType::SRV) && !data.services.is_empty() {
            // CoreDNS: priority 0, the weight shared evenly (at least 1).
            let weight = u16::try_from(100 / data.services.len()).unwrap_or(0).max(1);
            for service in &data.services {
                let srv = SRV::new(0, weight, service.port, service.target.clone());
                records.push(record(RData::SRV(srv)));
            }
        }
        if wanted(RecordType::PTR) {
            for pointer in &data.pointers {
                records.push(record(RData::PTR(PTR(pointer.clone()))));
            }
        }
        records
    }

    /// The A and AAAA records of the SRV answers' targets, each once.
    fn srv_target_addresses(&self, answers: &[Record]) -> Vec<Record> {
        let mut targets: Vec<&Name> = Vec::new();
        for record in answers {
            if let RData::SRV(srv) = &record.data
                && !targets.contains(&&srv.target)
            {
                targets.push(&srv.target);
            }
        }
        let ttl = self.config.ttl();
        targets
            .into_iter()
            .filter_map(|target| Some((target, self.names.get(&target.to_lowercase())?)))
            .flat_map(|(target, data)| {
                data.addresses.iter().map(move |ip| {
                    let rdata = match ip {
                        IpAddr::V4(v4) => RData::A(A(*v4)),
                        IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                    };
                    Record::from_rdata(target.clone(), ttl, rdata)
                })
            })
            .collect()
    }
}
