//! A Service's names: A/AAAA of ClusterIPs and of ready endpoints (from
//! every slice of the Service), endpoint names, SRV, CNAME.

use super::*;

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
    // db-1's ready condition is unset: ready; db-2's is false.
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
fn a_terminating_endpoint_is_not_ready() {
    let snapshot = cluster();
    let answer = ask(
        &snapshot,
        "terminating.demo.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(ips(&answer.answers), [ip("10.244.1.60")]);
    let srv = ask(
        &snapshot,
        "_http._tcp.terminating.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_eq!(
        srvs(&srv),
        [(
            0,
            100,
            80,
            "10-244-1-60.terminating.demo.svc.cluster.local.".to_string()
        )]
    );
    let gone = ask(
        &snapshot,
        "10-244-1-61.terminating.demo.svc.cluster.local.",
        RecordType::A,
    );
    assert_negative(&gone, ResponseCode::NXDomain, "cluster.local.");
}

#[test]
fn a_services_slices_are_merged_and_an_endpoint_in_two_counts_once() {
    let snapshot = cluster();
    // Slices in name order, whatever order they were listed in.
    let a = ask(&snapshot, "sharded.demo.svc.cluster.local.", RecordType::A);
    assert_eq!(ips(&a.answers), [ip("10.244.4.1"), ip("10.244.4.2")]);
    let srv = ask(
        &snapshot,
        "_http._tcp.sharded.demo.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_eq!(
        srvs(&srv),
        [
            (0, 50, 80, "s-0.sharded.demo.svc.cluster.local.".to_string()),
            (0, 50, 80, "s-1.sharded.demo.svc.cluster.local.".to_string()),
        ]
    );
    let s0 = ask(
        &snapshot,
        "s-0.sharded.demo.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(ips(&s0.answers), [ip("10.244.4.1")]);
    let ptr = snapshot.answer(&Name::from(ip("10.244.4.1")), RecordType::PTR, DNSClass::IN);
    assert_eq!(targets(&ptr), ["s-0.sharded.demo.svc.cluster.local."]);
    // Built again from the same slices in another order: the same answers.
    let mut reversed = slices();
    reversed.reverse();
    let again = ClusterSnapshot::build(config(), services().iter(), reversed.iter(), SERIAL);
    for (qname, qtype) in [
        ("sharded.demo.svc.cluster.local.", RecordType::A),
        (
            "_http._tcp.sharded.demo.svc.cluster.local.",
            RecordType::SRV,
        ),
        ("db.demo.svc.cluster.local.", RecordType::A),
        ("_postgres._tcp.db.demo.svc.cluster.local.", RecordType::SRV),
    ] {
        assert_eq!(
            ask(&again, qname, qtype).answers,
            ask(&snapshot, qname, qtype).answers,
            "{qname}"
        );
    }
}

#[test]
fn slices_of_no_service_of_another_namespace_or_of_names_add_nothing() {
    let snapshot = cluster();
    for (qname, apex) in [
        // Unlabelled, and labelled for a Service that does not exist.
        ("9.9.244.10.in-addr.arpa.", "in-addr.arpa."),
        ("10.9.244.10.in-addr.arpa.", "in-addr.arpa."),
        ("ghost.demo.svc.cluster.local.", "cluster.local."),
        // Labelled "web" in namespace "other": not demo's web.
        ("11.9.244.10.in-addr.arpa.", "in-addr.arpa."),
        ("10-244-9-11.web.demo.svc.cluster.local.", "cluster.local."),
        ("web.other.svc.cluster.local.", "cluster.local."),
    ] {
        let answer = ask(&snapshot, qname, RecordType::ANY);
        assert_negative(&answer, ResponseCode::NXDomain, apex);
    }
    // web's FQDN slice adds no endpoint: web's endpoints are the IPv4
    // slice's two, named by address.
    let ptr = ask(&snapshot, "6.2.244.10.in-addr.arpa.", RecordType::PTR);
    assert_eq!(targets(&ptr), ["10-244-2-6.web.demo.svc.cluster.local."]);
}

#[test]
fn endpoints_are_named_by_hostname_else_by_their_address_with_dashes() {
    let snapshot = cluster();
    let db0 = ask(&snapshot, "db-0.db.demo.svc.cluster.local.", RecordType::A);
    assert_positive(&db0);
    assert_eq!(ips(&db0.answers), [ip("10.244.1.7")]);
    // A hostname is matched without case (DB-1 in the slice).
    let db1 = ask(&snapshot, "db-1.db.demo.svc.cluster.local.", RecordType::A);
    assert_eq!(ips(&db1.answers), [ip("10.244.2.8")]);
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
