//! The rest of the zones: pod names, PTR, the schema version, SOA,
//! NXDOMAIN and NODATA, refusals, the zone's configuration.

use super::*;
use crate::error::ConfigError;

#[test]
fn pod_names_spell_their_address() {
    let snapshot = cluster();
    let v4 = ask(
        &snapshot,
        "10-244-1-5.demo.pod.cluster.local.",
        RecordType::A,
    );
    assert_positive(&v4);
    assert_eq!(ips(&v4.answers), [ip("10.244.1.5")]);
    // Any namespace, any address: no pod is looked up (pods insecure).
    let other = ask(
        &snapshot,
        "192-0-2-77.anywhere.pod.cluster.local.",
        RecordType::A,
    );
    assert_eq!(ips(&other.answers), [ip("192.0.2.77")]);
    let v6 = ask(
        &snapshot,
        "fd00-244--9.demo.pod.cluster.local.",
        RecordType::AAAA,
    );
    assert_eq!(ips(&v6.answers), [ip("fd00:244::9")]);
    let long_v6 = ask(
        &snapshot,
        "fd00-0-0-0-0-0-0-1.demo.pod.cluster.local.",
        RecordType::AAAA,
    );
    assert_eq!(ips(&long_v6.answers), [ip("fd00::1")]);
    // An IPv4 pod has no AAAA.
    let nodata = ask(
        &snapshot,
        "10-244-1-5.demo.pod.cluster.local.",
        RecordType::AAAA,
    );
    assert_negative(&nodata, ResponseCode::NoError, "cluster.local.");
    let namespace = ask(&snapshot, "demo.pod.cluster.local.", RecordType::A);
    assert_negative(&namespace, ResponseCode::NoError, "cluster.local.");
    for bad in [
        "not-an-ip.demo.pod.cluster.local.",
        "10-244-1-300.demo.pod.cluster.local.",
        "x.10-244-1-5.demo.pod.cluster.local.",
    ] {
        let answer = ask(&snapshot, bad, RecordType::A);
        assert_negative(&answer, ResponseCode::NXDomain, "cluster.local.");
    }
}

#[test]
fn cluster_ips_and_endpoint_addresses_have_ptr_records() {
    let snapshot = cluster();
    let cases = [
        (
            "1.0.96.10.in-addr.arpa.",
            "kubernetes.default.svc.cluster.local.",
        ),
        ("20.0.96.10.in-addr.arpa.", "web.demo.svc.cluster.local."),
        (
            "7.1.244.10.in-addr.arpa.",
            "db-0.db.demo.svc.cluster.local.",
        ),
        (
            "5.1.244.10.in-addr.arpa.",
            "10-244-1-5.web.demo.svc.cluster.local.",
        ),
        (
            "10.1.168.192.in-addr.arpa.",
            "192-168-1-10.kubernetes.default.svc.cluster.local.",
        ),
    ];
    for (reverse, target) in cases {
        let answer = ask(&snapshot, reverse, RecordType::PTR);
        assert_positive(&answer);
        assert_eq!(targets(&answer), [target], "{reverse}");
        assert_eq!(answer.answers[0].name, name(reverse));
    }
    let v6_service = Name::from(ip("fd00:96::20"));
    let answer = snapshot.answer(&v6_service, RecordType::PTR, DNSClass::IN);
    assert_eq!(targets(&answer), ["web.demo.svc.cluster.local."]);
    let v6_endpoint = Name::from(ip("fd00:244::9"));
    let answer = snapshot.answer(&v6_endpoint, RecordType::PTR, DNSClass::IN);
    assert_eq!(targets(&answer), ["fd00-244--9.db.demo.svc.cluster.local."]);
    // Unknown addresses (and those of slices of no Service) have none.
    for unknown in ["9.9.9.10.in-addr.arpa.", "9.9.244.10.in-addr.arpa."] {
        let answer = ask(&snapshot, unknown, RecordType::PTR);
        assert_negative(&answer, ResponseCode::NXDomain, "in-addr.arpa.");
    }
    let unknown_v6 = snapshot.answer(&Name::from(ip("fd00::99")), RecordType::PTR, DNSClass::IN);
    assert_negative(&unknown_v6, ResponseCode::NXDomain, "ip6.arpa.");
    // A name above known addresses exists (no records of its own).
    let partial = ask(&snapshot, "96.10.in-addr.arpa.", RecordType::PTR);
    assert_negative(&partial, ResponseCode::NoError, "in-addr.arpa.");
}

#[test]
fn dns_version_is_a_txt_record() {
    let answer = ask(&cluster(), "dns-version.cluster.local.", RecordType::TXT);
    assert_positive(&answer);
    let RData::TXT(txt) = &answer.answers[0].data else {
        panic!("{answer:?}");
    };
    assert_eq!(txt.txt_data.len(), 1);
    assert_eq!(&*txt.txt_data[0], b"1.1.0");
    assert_eq!(answer.answers[0].ttl, 28800);
}

#[test]
fn unknown_names_are_nxdomain_with_the_zone_soa() {
    let snapshot = cluster();
    for unknown in [
        "nope.demo.svc.cluster.local.",
        "web.nope.svc.cluster.local.",
        "nope.svc.cluster.local.",
        "something.cluster.local.",
        "a.b.web.demo.svc.cluster.local.",
    ] {
        let answer = ask(&snapshot, unknown, RecordType::A);
        assert_negative(&answer, ResponseCode::NXDomain, "cluster.local.");
    }
    let answer = ask(&snapshot, "nope.demo.svc.cluster.local.", RecordType::A);
    let RData::SOA(soa) = &answer.authorities[0].data else {
        panic!("{answer:?}");
    };
    assert_eq!(soa.mname, name("ns.dns.cluster.local."));
    assert_eq!(soa.rname, name("hostmaster.cluster.local."));
    assert_eq!(soa.serial, SERIAL);
    assert_eq!(soa.minimum, 5);
    assert_eq!(answer.authorities[0].ttl, 5);
}

#[test]
fn known_names_without_the_asked_type_are_nodata_with_the_soa() {
    let snapshot = cluster();
    for (known, qtype) in [
        ("kubernetes.default.svc.cluster.local.", RecordType::TXT),
        ("kubernetes.default.svc.cluster.local.", RecordType::MX),
        // Names above others exist: namespaces with services, svc, pod,
        // the protocol label of SRV names, the apex.
        ("demo.svc.cluster.local.", RecordType::A),
        ("svc.cluster.local.", RecordType::A),
        ("pod.cluster.local.", RecordType::A),
        ("_tcp.web.demo.svc.cluster.local.", RecordType::SRV),
        ("_http._tcp.web.demo.svc.cluster.local.", RecordType::A),
        ("cluster.local.", RecordType::A),
        ("dns-version.cluster.local.", RecordType::A),
    ] {
        let answer = ask(&snapshot, known, qtype);
        assert_negative(&answer, ResponseCode::NoError, "cluster.local.");
    }
}

#[test]
fn each_zone_apex_has_its_soa() {
    let snapshot = cluster();
    for apex in ["cluster.local.", "in-addr.arpa.", "ip6.arpa."] {
        let answer = ask(&snapshot, apex, RecordType::SOA);
        assert_positive(&answer);
        let RData::SOA(soa) = &answer.answers[0].data else {
            panic!("{answer:?}");
        };
        assert_eq!(soa.mname, name(&format!("ns.dns.{apex}")));
    }
}

#[test]
fn any_returns_every_record_of_the_name() {
    let answer = ask(&cluster(), "web.demo.svc.cluster.local.", RecordType::ANY);
    let types: Vec<RecordType> = answer.answers.iter().map(Record::record_type).collect();
    assert_eq!(
        types,
        [
            RecordType::A,
            RecordType::AAAA,
            RecordType::SRV,
            RecordType::SRV,
            RecordType::SRV
        ]
    );
}

#[test]
fn other_names_classes_and_transfers_are_refused() {
    let snapshot = cluster();
    for (qname, qtype, qclass) in [
        ("example.com.", RecordType::A, DNSClass::IN),
        (
            "kubernetes.default.svc.cluster.local.example.",
            RecordType::A,
            DNSClass::IN,
        ),
        ("local.", RecordType::SOA, DNSClass::IN),
        (".", RecordType::NS, DNSClass::IN),
        (
            "kubernetes.default.svc.cluster.local.",
            RecordType::A,
            DNSClass::CH,
        ),
        ("cluster.local.", RecordType::AXFR, DNSClass::IN),
    ] {
        let answer = snapshot.answer(&name(qname), qtype, qclass);
        assert_eq!(answer.response_code, ResponseCode::Refused, "{qname}");
        assert!(!answer.authoritative);
        assert!(answer.answers.is_empty() && answer.authorities.is_empty());
    }
}

#[test]
fn an_unsynced_snapshot_fails_in_the_zones_and_refuses_outside() {
    let snapshot = ClusterSnapshot::unsynced(config());
    assert!(!snapshot.is_synced());
    for qname in [
        "kubernetes.default.svc.cluster.local.",
        "1.0.96.10.in-addr.arpa.",
    ] {
        let answer = ask(&snapshot, qname, RecordType::A);
        assert_eq!(answer.response_code, ResponseCode::ServFail);
        assert!(answer.answers.is_empty() && answer.authorities.is_empty());
    }
    let outside = ask(&snapshot, "example.com.", RecordType::A);
    assert_eq!(outside.response_code, ResponseCode::Refused);
}

#[test]
fn another_zone_and_ttl_are_honoured() {
    let config = ZoneConfig::new("Example.Internal.", 30).unwrap();
    let services = [cluster_ip_service(
        "default",
        "kubernetes",
        &["10.96.0.1"],
        &[],
    )];
    let snapshot = ClusterSnapshot::build(config, services.iter(), [].iter(), SERIAL);
    let answer = ask(
        &snapshot,
        "kubernetes.default.svc.example.internal.",
        RecordType::A,
    );
    assert_eq!(ips(&answer.answers), [ip("10.96.0.1")]);
    assert_eq!(answer.answers[0].ttl, 30);
    let refused = ask(
        &snapshot,
        "kubernetes.default.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(refused.response_code, ResponseCode::Refused);
    // The SOA's own TTL is capped at 300, its minimum is the TTL.
    let long = ZoneConfig::new("cluster.local", 3600).unwrap();
    let snapshot = ClusterSnapshot::build(long, [].iter(), [].iter(), SERIAL);
    let answer = ask(&snapshot, "nope.cluster.local.", RecordType::A);
    assert_eq!(answer.authorities[0].ttl, 300);
}

#[test]
fn zone_config_normalizes_the_zone_and_rejects_unservable_ones() {
    let plain = ZoneConfig::new("cluster.local", 5).unwrap();
    let dotted = ZoneConfig::new("Cluster.LOCAL.", 5).unwrap();
    assert_eq!(plain, dotted);
    assert!(plain.zone().eq_case(&name("cluster.local.")));
    assert!(matches!(
        ZoneConfig::new(".", 5),
        Err(ConfigError::RootZone)
    ));
    for overlapping in ["in-addr.arpa", "10.in-addr.arpa", "arpa"] {
        assert!(matches!(
            ZoneConfig::new(overlapping, 5),
            Err(ConfigError::OverlapsReverseZones(_))
        ));
    }
    assert!(matches!(
        ZoneConfig::new("bad..zone", 5),
        Err(ConfigError::InvalidZone { .. })
    ));
}

#[test]
fn services_without_a_cluster_ip_or_spec_are_left_out() {
    let mut pending = cluster_ip_service("demo", "pending", &["10.96.0.30"], &[]);
    if let Some(spec) = pending.spec.as_mut() {
        spec.cluster_ip = None;
        spec.cluster_ips = None;
    }
    let bare = Service {
        metadata: meta("demo", "bare"),
        ..Service::default()
    };
    let services = [pending, bare];
    let snapshot = ClusterSnapshot::build(config(), services.iter(), [].iter(), SERIAL);
    for qname in [
        "pending.demo.svc.cluster.local.",
        "bare.demo.svc.cluster.local.",
    ] {
        let answer = ask(&snapshot, qname, RecordType::A);
        assert_negative(&answer, ResponseCode::NXDomain, "cluster.local.");
    }
}
