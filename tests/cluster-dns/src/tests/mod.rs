//! The record kinds, from Services and EndpointSlices built with
//! k8s-openapi's types, answered by the pure resolver (no network, no
//! root): `records` for a Service's names and SRV records, `zones` for
//! everything else in the zones (pods, PTR, SOA, refusals).

mod records;
mod zones;

use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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

/// One endpoint: (address, hostname, conditions.ready); None: unset.
type SliceEndpoint<'a> = (&'a str, Option<&'a str>, Option<bool>);

fn ready(address: &str) -> SliceEndpoint<'_> {
    (address, None, Some(true))
}

/// An EndpointSlice `name` in `namespace`, labelled as `service`'s (no
/// label with None), of `address_type`, as the slice controller writes
/// them (a not-ready endpoint is also marked terminating and serving, as
/// a terminating pod's is: that it is not ready is all that counts).
fn slice(
    (namespace, name): (&str, &str),
    service: Option<&str>,
    address_type: &str,
    endpoints: &[SliceEndpoint],
    ports: &[Port],
) -> EndpointSlice {
    let mut metadata = meta(namespace, name);
    metadata.labels = service.map(|service| {
        BTreeMap::from([(
            "kubernetes.io/service-name".to_string(),
            service.to_string(),
        )])
    });
    EndpointSlice {
        metadata,
        address_type: address_type.to_string(),
        endpoints: Some(
            endpoints
                .iter()
                .map(|(address, hostname, ready)| Endpoint {
                    addresses: vec![address.to_string()],
                    hostname: hostname.map(str::to_string),
                    conditions: ready.map(|ready| EndpointConditions {
                        ready: Some(ready),
                        serving: Some(true),
                        terminating: Some(!ready),
                    }),
                    ..Endpoint::default()
                })
                .collect(),
        ),
        ports: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|(name, port, protocol)| EndpointPort {
                    name: name.map(str::to_string),
                    port: Some(*port),
                    protocol: Some(protocol.to_string()),
                    ..EndpointPort::default()
                })
                .collect()
        }),
    }
}

/// A Service's slice in its namespace, of IPv4 addresses.
fn v4_slice(
    (namespace, service): (&str, &str),
    name: &str,
    endpoints: &[SliceEndpoint],
    ports: &[Port],
) -> EndpointSlice {
    slice((namespace, name), Some(service), "IPv4", endpoints, ports)
}

fn config() -> ZoneConfig {
    ZoneConfig::new("cluster.local", 5).unwrap()
}

fn services() -> Vec<Service> {
    vec![
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
        headless_service("demo", "terminating", &[(Some("http"), 80, "TCP")]),
        headless_service("demo", "sharded", &[(Some("http"), 80, "TCP")]),
        external_name_service("demo", "external", "Example.ORG"),
        external_name_service("demo", "alias", "web.demo.svc.cluster.local"),
        external_name_service("demo", "numeric", "192.0.2.1"),
    ]
}

/// The slices of `services()`, and some of no Service.
fn slices() -> Vec<EndpointSlice> {
    let http = [(Some("http"), 80, "TCP")];
    let postgres = [(Some("postgres"), 5432, "TCP")];
    // A port without a number ("all ports") has no SRV.
    let mut portless = slice(
        ("demo", "portless-1"),
        Some("portless"),
        "IPv4",
        &[ready("10.244.3.3")],
        &[],
    );
    portless.ports = Some(vec![EndpointPort::default()]);
    vec![
        v4_slice(
            ("default", "kubernetes"),
            "kubernetes",
            &[ready("192.168.1.10")],
            &[(Some("https"), 6443, "TCP")],
        ),
        v4_slice(
            ("demo", "web"),
            "web-x7k2p",
            &[ready("10.244.1.5"), ready("10.244.2.6")],
            &[
                (Some("http"), 8080, "TCP"),
                (Some("dns"), 5353, "UDP"),
                (None, 9090, "TCP"),
            ],
        ),
        // The deprecated FQDN type: names, not addresses; nothing to serve.
        slice(
            ("demo", "web-fqdn"),
            Some("web"),
            "FQDN",
            &[ready("backend.example.org")],
            &[(Some("http"), 8080, "TCP")],
        ),
        // One slice per address family: db-1's ready condition is unset
        // (ready), db-2's false.
        v4_slice(
            ("demo", "db"),
            "db-4mz8q",
            &[
                ("10.244.1.7", Some("db-0"), Some(true)),
                ("10.244.2.8", Some("DB-1"), None),
                ("10.244.1.99", Some("db-2"), Some(false)),
            ],
            &postgres,
        ),
        slice(
            ("demo", "db-v6"),
            Some("db"),
            "IPv6",
            &[ready("fd00:244::9")],
            &postgres,
        ),
        v4_slice(
            ("demo", "empty"),
            "empty-1",
            &[("10.244.1.50", None, Some(false))],
            &http,
        ),
        portless,
        v4_slice(
            ("demo", "terminating"),
            "terminating-1",
            &[ready("10.244.1.60"), ("10.244.1.61", None, Some(false))],
            &http,
        ),
        // Two slices of one family, listed out of order, s-0 in both (as
        // while the controller moves an endpoint between slices).
        v4_slice(
            ("demo", "sharded"),
            "sharded-2",
            &[
                ("10.244.4.2", Some("s-1"), Some(true)),
                ("10.244.4.1", Some("s-0"), Some(true)),
            ],
            &http,
        ),
        v4_slice(
            ("demo", "sharded"),
            "sharded-1",
            &[("10.244.4.1", Some("s-0"), Some(true))],
            &http,
        ),
        // A slice without the service-name label (leader election, say),
        // one of a Service that does not exist, and one labelled "web" in
        // another namespace: no names.
        slice(
            ("kube-system", "kube-scheduler"),
            None,
            "IPv4",
            &[ready("10.244.9.9")],
            &[],
        ),
        v4_slice(("demo", "ghost"), "ghost-1", &[ready("10.244.9.10")], &http),
        v4_slice(("other", "web"), "web-1", &[ready("10.244.9.11")], &http),
    ]
}

/// A small cluster with one of everything.
fn cluster() -> ClusterSnapshot {
    ClusterSnapshot::build(config(), services().iter(), slices().iter(), SERIAL)
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
