//! The record kinds, from Services and Endpoints built with k8s-openapi's
//! types, answered by the pure resolver (no network, no root).

use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::ConfigError;
use crate::resolver::Answer;
use crate::snapshot::{ClusterSnapshot, ZoneConfig};

const SERIAL: u32 = 1_700_000_000;

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        ..ObjectMeta::default()
    }
}

/// (name, port, protocol)
type Port<'a> = (Option<&'a str>, i32, &'a str);

fn service(namespace: &str, name: &str, spec: ServiceSpec) -> Service {
    Service {
        metadata: meta(namespace, name),
        spec: Some(spec),
        status: None,
    }
}

fn service_ports(ports: &[Port]) -> Option<Vec<ServicePort>> {
    Some(
        ports
            .iter()
            .map(|(name, port, protocol)| ServicePort {
                name: name.map(str::to_string),
                port: *port,
                protocol: Some(protocol.to_string()),
                ..ServicePort::default()
            })
            .collect(),
    )
}

fn cluster_ip_service(namespace: &str, name: &str, ips: &[&str], ports: &[Port]) -> Service {
    service(
        namespace,
        name,
        ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ips[0].to_string()),
            cluster_ips: Some(ips.iter().map(|ip| ip.to_string()).collect()),
            ports: service_ports(ports),
            ..ServiceSpec::default()
        },
    )
}

fn headless_service(namespace: &str, name: &str, ports: &[Port]) -> Service {
    service(
        namespace,
        name,
        ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some("None".into()),
            cluster_ips: Some(vec!["None".into()]),
            ports: service_ports(ports),
            ..ServiceSpec::default()
        },
    )
}

fn external_name_service(namespace: &str, name: &str, target: &str) -> Service {
    service(
        namespace,
        name,
        ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some(target.into()),
            ..ServiceSpec::default()
        },
    )
}

/// (ip, hostname)
type Address<'a> = (&'a str, Option<&'a str>);

fn addresses(list: &[Address]) -> Option<Vec<EndpointAddress>> {
    (!list.is_empty()).then(|| {
        list.iter()
            .map(|(ip, hostname)| EndpointAddress {
                ip: ip.to_string(),
                hostname: hostname.map(str::to_string),
                ..EndpointAddress::default()
            })
            .collect()
    })
}

fn subset(ready: &[Address], not_ready: &[Address], ports: &[Port]) -> EndpointSubset {
    EndpointSubset {
        addresses: addresses(ready),
        not_ready_addresses: addresses(not_ready),
        ports: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|(name, port, protocol)| EndpointPort {
                    name: name.map(str::to_string),
                    port: *port,
                    protocol: Some(protocol.to_string()),
                    ..EndpointPort::default()
                })
                .collect()
        }),
    }
}

fn endpoints(namespace: &str, name: &str, subsets: Vec<EndpointSubset>) -> Endpoints {
    Endpoints {
        metadata: meta(namespace, name),
        subsets: Some(subsets),
    }
}

fn config() -> ZoneConfig {
    ZoneConfig::new("cluster.local", 5).unwrap()
}

/// A small cluster with one of everything.
fn cluster() -> ClusterSnapshot {
    let mut tolerant = headless_service("demo", "tolerant", &[(Some("http"), 80, "TCP")]);
    tolerant.metadata.annotations = Some(BTreeMap::from([(
        "service.alpha.kubernetes.io/tolerate-unready-endpoints".to_string(),
        "true".to_string(),
    )]));
    let services = [
        cluster_ip_service(
            "default",
            "kubernetes",
            &["10.96.0.1"],
            &[(Some("https"), 443, "TCP")],
        ),
        cluster_ip_service(
            "demo",
            "web",
            &["10.96.0.20", "fd00:96::20"],
            &[
                (Some("http"), 80, "TCP"),
                (Some("dns"), 53, "UDP"),
                (None, 8080, "TCP"),
            ],
        ),
        headless_service("demo", "db", &[(Some("postgres"), 5432, "TCP")]),
        headless_service("demo", "empty", &[(Some("http"), 80, "TCP")]),
        headless_service("demo", "portless", &[]),
        tolerant,
        external_name_service("demo", "external", "Example.ORG"),
        external_name_service("demo", "alias", "web.demo.svc.cluster.local"),
        external_name_service("demo", "numeric", "192.0.2.1"),
    ];
    let endpoints = [
        endpoints(
            "default",
            "kubernetes",
            vec![subset(
                &[("192.168.1.10", None)],
                &[],
                &[(Some("https"), 6443, "TCP")],
            )],
        ),
        endpoints(
            "demo",
            "web",
            vec![subset(
                &[("10.244.1.5", None), ("10.244.2.6", None)],
                &[],
                &[
                    (Some("http"), 8080, "TCP"),
                    (Some("dns"), 5353, "UDP"),
                    (None, 9090, "TCP"),
                ],
            )],
        ),
        endpoints(
            "demo",
            "db",
            vec![
                subset(
                    &[("10.244.1.7", Some("db-0")), ("10.244.2.8", Some("db-1"))],
                    &[("10.244.1.99", Some("db-2"))],
                    &[(Some("postgres"), 5432, "TCP")],
                ),
                subset(
                    &[("fd00:244::9", None)],
                    &[],
                    &[(Some("postgres"), 5432, "TCP")],
                ),
            ],
        ),
        endpoints(
            "demo",
            "empty",
            vec![subset(
                &[],
                &[("10.244.1.50", None)],
                &[(Some("http"), 80, "TCP")],
            )],
        ),
        endpoints(
            "demo",
            "portless",
            vec![subset(&[("10.244.3.3", None)], &[], &[])],
        ),
        endpoints(
            "demo",
            "tolerant",
            vec![subset(
                &[("10.244.1.60", None)],
                &[("10.244.1.61", None)],
                &[(Some("http"), 80, "TCP")],
            )],
        ),
        // Endpoints with no Service (leader election, say): no names.
        endpoints(
            "kube-system",
            "kube-scheduler",
            vec![subset(&[("10.244.9.9", None)], &[], &[])],
        ),
    ];
    ClusterSnapshot::build(config(), services.iter(), endpoints.iter(), SERIAL)
}

fn name(text: &str) -> Name {
    Name::from_ascii(text).unwrap()
}

fn ask(snapshot: &ClusterSnapshot, qname: &str, qtype: RecordType) -> Answer {
    snapshot.answer(&name(qname), qtype, DNSClass::IN)
}

fn ips(records: &[Record]) -> Vec<IpAddr> {
    records
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
            _ => None,
        })
        .collect()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// (priority, weight, port, target) of each SRV answer.
fn srvs(answer: &Answer) -> Vec<(u16, u16, u16, String)> {
    answer
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::SRV(srv) => (srv.priority, srv.weight, srv.port, srv.target.to_string()),
            other => panic!("not SRV: {other:?}"),
        })
        .collect()
}

fn targets(answer: &Answer) -> Vec<String> {
    answer
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::PTR(ptr) => ptr.0.to_string(),
            RData::CNAME(cname) => cname.0.to_string(),
            other => panic!("not a name: {other:?}"),
        })
        .collect()
}

/// NOERROR, authoritative, with answers and no SOA.
fn assert_positive(answer: &Answer) {
    assert_eq!(answer.response_code, ResponseCode::NoError, "{answer:?}");
    assert!(answer.authoritative);
    assert!(!answer.answers.is_empty(), "{answer:?}");
    assert!(answer.authorities.is_empty());
}

/// `response_code`, authoritative, no answers, the SOA of `apex`.
fn assert_negative(answer: &Answer, response_code: ResponseCode, apex: &str) {
    assert_eq!(answer.response_code, response_code, "{answer:?}");
    assert!(answer.authoritative);
    assert!(answer.answers.is_empty(), "{answer:?}");
    assert_eq!(answer.authorities.len(), 1);
    let soa = &answer.authorities[0];
    assert_eq!(soa.name, name(apex));
    assert!(matches!(soa.data, RData::SOA(_)), "{soa:?}");
}

#[test]
fn a_cluster_ip_service_answers_its_cluster_ip() {
    let answer = ask(
        &cluster(),
        "kubernetes.default.svc.cluster.local.",
        RecordType::A,
    );
    assert_positive(&answer);
    assert_eq!(ips(&answer.answers), [ip("10.96.0.1")]);
    let record = &answer.answers[0];
    assert_eq!(record.ttl, 5);
    assert_eq!(record.dns_class, DNSClass::IN);
    assert!(answer.additionals.is_empty());
}

#[test]
fn names_match_without_case_and_answers_keep_the_asked_case() {
    let asked = name("KuberNETES.Default.SVC.cluster.LOCAL.");
    let answer = cluster().answer(&asked, RecordType::A, DNSClass::IN);
    assert_positive(&answer);
    assert_eq!(ips(&answer.answers), [ip("10.96.0.1")]);
    assert!(answer.answers[0].name.eq_case(&asked));
}

#[test]
fn a_dual_stack_service_answers_a_and_aaaa_from_its_cluster_ips() {
    let snapshot = cluster();
    let a = ask(&snapshot, "web.demo.svc.cluster.local.", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.96.0.20")]);
    let aaaa = ask(&snapshot, "web.demo.svc.cluster.local.", RecordType::AAAA);
    assert_positive(&aaaa);
    assert_eq!(ips(&aaaa.answers), [ip("fd00:96::20")]);
    // A single-stack service has no AAAA: NODATA.
    let none = ask(
        &snapshot,
        "kubernetes.default.svc.cluster.local.",
        RecordType::AAAA,
    );
    assert_negative(&none, ResponseCode::NoError, "cluster.local.");
}

#[test]
fn a_headless_service_answers_its_ready_endpoints_only() {
    let snapshot = cluster();
    let a = ask(&snapshot, "db.demo.svc.cluster.local.", RecordType::A);
    assert_positive(&a);
    // db-2 is not ready.
    assert_eq!(ips(&a.answers), [ip("10.244.1.7"), ip("10.244.2.8")]);
    let aaaa = ask(&snapshot, "db.demo.svc.cluster.local.", RecordType::AAAA);
    assert_eq!(ips(&aaaa.answers), [ip("fd00:244::9")]);
}

#[test]
fn a_headless_service_without_ready_endpoints_does_not_exist() {
    let snapshot = cluster();
    let answer = ask(&snapshot, "empty.demo.svc.cluster.local.", RecordType::A);
    assert_negative(&answer, ResponseCode::NXDomain, "cluster.local.");
    let srv = ask(
        &snapshot,
        "_http._tcp.empty.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_negative(&srv, ResponseCode::NXDomain, "cluster.local.");
}

#[test]
fn the_tolerate_unready_annotation_counts_not_ready_addresses() {
    let answer = ask(
        &cluster(),
        "tolerant.demo.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(ips(&answer.answers), [ip("10.244.1.60"), ip("10.244.1.61")]);
}

#[test]
fn endpoints_are_named_by_hostname_else_by_their_address_with_dashes() {
    let snapshot = cluster();
    let db0 = ask(&snapshot, "db-0.db.demo.svc.cluster.local.", RecordType::A);
    assert_positive(&db0);
    assert_eq!(ips(&db0.answers), [ip("10.244.1.7")]);
    let v6 = ask(
        &snapshot,
        "fd00-244--9.db.demo.svc.cluster.local.",
        RecordType::AAAA,
    );
    assert_eq!(ips(&v6.answers), [ip("fd00:244::9")]);
    // The endpoints of a ClusterIP service have names too (as in CoreDNS).
    let web = ask(
        &snapshot,
        "10-244-1-5.web.demo.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(ips(&web.answers), [ip("10.244.1.5")]);
    // A not-ready endpoint has none.
    let db2 = ask(&snapshot, "db-2.db.demo.svc.cluster.local.", RecordType::A);
    assert_negative(&db2, ResponseCode::NXDomain, "cluster.local.");
    // A headless service without ports still has its addresses.
    let portless = ask(&snapshot, "portless.demo.svc.cluster.local.", RecordType::A);
    assert_eq!(ips(&portless.answers), [ip("10.244.3.3")]);
}

#[test]
fn a_named_port_of_a_cluster_ip_service_has_srv_to_the_service() {
    let snapshot = cluster();
    let http = ask(
        &snapshot,
        "_http._tcp.web.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_positive(&http);
    // The service's port, not the endpoints' target port.
    assert_eq!(
        srvs(&http),
        [(0, 100, 80, "web.demo.svc.cluster.local.".to_string())]
    );
    // The target's addresses in the additional section.
    assert_eq!(
        ips(&http.additionals),
        [ip("10.96.0.20"), ip("fd00:96::20")]
    );
    assert!(
        http.additionals
            .iter()
            .all(|r| r.name == name("web.demo.svc.cluster.local."))
    );
    let dns = ask(
        &snapshot,
        "_dns._udp.web.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_eq!(
        srvs(&dns),
        [(0, 100, 53, "web.demo.svc.cluster.local.".to_string())]
    );
    // Wrong protocol, unknown port name.
    let wrong = ask(
        &snapshot,
        "_dns._tcp.web.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_negative(&wrong, ResponseCode::NXDomain, "cluster.local.");
    let unknown = ask(
        &snapshot,
        "_grpc._tcp.web.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_negative(&unknown, ResponseCode::NXDomain, "cluster.local.");
}

#[test]
fn a_named_port_of_a_headless_service_has_one_srv_per_ready_endpoint() {
    let answer = ask(
        &cluster(),
        "_postgres._tcp.db.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_positive(&answer);
    assert_eq!(
        srvs(&answer),
        [
            (0, 33, 5432, "db-0.db.demo.svc.cluster.local.".to_string()),
            (0, 33, 5432, "db-1.db.demo.svc.cluster.local.".to_string()),
            (
                0,
                33,
                5432,
                "fd00-244--9.db.demo.svc.cluster.local.".to_string()
            ),
        ]
    );
    assert_eq!(
        ips(&answer.additionals),
        [ip("10.244.1.7"), ip("10.244.2.8"), ip("fd00:244::9")]
    );
    assert_eq!(
        answer.additionals[0].name,
        name("db-0.db.demo.svc.cluster.local.")
    );
}

#[test]
fn srv_at_a_service_name_lists_every_port() {
    let snapshot = cluster();
    let web = ask(&snapshot, "web.demo.svc.cluster.local.", RecordType::SRV);
    assert_positive(&web);
    let target = "web.demo.svc.cluster.local.".to_string();
    // Unnamed ports too, as CoreDNS.
    assert_eq!(
        srvs(&web),
        [
            (0, 33, 80, target.clone()),
            (0, 33, 53, target.clone()),
            (0, 33, 8080, target)
        ]
    );
    assert_eq!(ips(&web.additionals), [ip("10.96.0.20"), ip("fd00:96::20")]);
    let db = ask(&snapshot, "db.demo.svc.cluster.local.", RecordType::SRV);
    assert_eq!(srvs(&db).len(), 3);
    // No ports, no SRV: NODATA.
    let portless = ask(
        &snapshot,
        "portless.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_negative(&portless, ResponseCode::NoError, "cluster.local.");
}

#[test]
fn an_external_name_service_is_a_cname() {
    let snapshot = cluster();
    let a = ask(&snapshot, "external.demo.svc.cluster.local.", RecordType::A);
    // The CNAME alone: the target is not ours and nobody else is asked.
    assert_positive(&a);
    assert_eq!(targets(&a), ["Example.ORG."]);
    assert_eq!(a.answers[0].name, name("external.demo.svc.cluster.local."));
    let cname = ask(
        &snapshot,
        "external.demo.svc.cluster.local.",
        RecordType::CNAME,
    );
    assert_eq!(targets(&cname), ["Example.ORG."]);
    // An address-shaped externalName has no record (CoreDNS, the docs).
    let numeric = ask(&snapshot, "numeric.demo.svc.cluster.local.", RecordType::A);
    assert_negative(&numeric, ResponseCode::NXDomain, "cluster.local.");
}

#[test]
fn a_cname_into_the_zone_is_followed() {
    let answer = ask(&cluster(), "alias.demo.svc.cluster.local.", RecordType::A);
    assert_positive(&answer);
    assert_eq!(answer.answers.len(), 2);
    let RData::CNAME(cname) = &answer.answers[0].data else {
        panic!("{answer:?}");
    };
    assert_eq!(cname.0, name("web.demo.svc.cluster.local."));
    // Then the target's address, owned by the target.
    assert_eq!(answer.answers[1].name, name("web.demo.svc.cluster.local."));
    assert_eq!(ips(&answer.answers), [ip("10.96.0.20")]);
}

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
    // Unknown addresses (and endpoints without a service) have none.
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
