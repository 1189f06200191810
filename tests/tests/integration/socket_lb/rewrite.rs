//! The socket programs, written through the Datapath API with no agent,
//! rewrite ClusterIPs to backends at connect() and sendmsg() and show the
//! ClusterIP back, TCP and UDP, both families, affinity and hairpin.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;

use flatnet_datapath::bpf::{Outside, service_backend, service_key};
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::*;
use serde_json::Value;

use super::api::BACKEND_PORT;
use super::fixture::{Backend, TCP, UDP, blackhole_services, client};

#[flatnet_test(root)]
fn cluster_ips_are_rewritten_to_backends_at_the_socket() {
    let net = Network::dual_stack("tc");
    let client_pod = net.pod();
    blackhole_services(&client_pod.netns);
    let pods: Vec<Pod> = (0..3).map(|_| net.pod()).collect();
    let names = ["b0", "b1", "b2"];
    let _backends: Vec<Backend> = pods
        .iter()
        .zip(names)
        .map(|(pod, name)| Backend::start(&pod.netns, name))
        .collect();
    let datapath = net.datapath();
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    datapath
        .attach_services(&cgroup.0)
        .expect("attaching the socket programs");
    assert!(datapath.services_attached());

    for v6 in [false, true] {
        let cluster_ip: IpAddr = if v6 {
            "fd96::7".parse().unwrap()
        } else {
            Ipv4Addr::new(10, 96, 7, 1).into()
        };
        let frontend = SocketAddr::new(cluster_ip, 80);
        let backend_of = |pod: &Pod| SocketAddr::new(pod.address(v6), BACKEND_PORT);
        let all: Vec<_> = pods
            .iter()
            .map(|p| service_backend(backend_of(p)))
            .collect();
        let tcp_key = service_key(cluster_ip, 80, TCP);
        datapath
            .put_service(&tcp_key, 1, &all, 0, Outside::No)
            .unwrap();

        // Three backends: every connection reaches one, all are used, and
        // the application sees the ClusterIP as its peer.
        let mut seen = BTreeSet::new();
        for _ in 0..30 {
            let (answer, peer) = client(&cgroup.0, &client_pod.netns, "tcp", frontend)
                .unwrap_or_else(|e| panic!("v6 {v6}: connect to {frontend}: {e:?}"));
            assert_eq!(peer, frontend, "getpeername() showed the backend");
            seen.insert(answer);
        }
        assert_eq!(seen, BTreeSet::from(names.map(String::from)), "v6 {v6}");

        // `flatnet inspect --services` shows the frontend and its backends.
        let out = Command::new(bin("flatnet"))
            .args(["inspect", "--services", "--json", "--network", &net.name])
            .output()
            .expect("flatnet inspect --services");
        assert!(out.status.success(), "{out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let frontends = report[0]["frontends"].as_array().expect("frontends");
        assert_eq!(report[0]["attached"], true, "{report}");
        assert_eq!(frontends.len(), 1, "{report}");
        assert_eq!(frontends[0]["cluster_ip"], cluster_ip.to_string());
        assert_eq!(frontends[0]["protocol"], "TCP");
        assert_eq!(frontends[0]["backends"].as_array().map(Vec::len), Some(3));

        // sessionAffinity ClientIP (60 s): the client pod keeps the backend
        // it was given.
        datapath
            .put_service(&tcp_key, 5, &all, 60, Outside::No)
            .unwrap();
        let answers: BTreeSet<String> = (0..10)
            .map(|_| {
                client(&cgroup.0, &client_pod.netns, "tcp", frontend)
                    .unwrap()
                    .0
            })
            .collect();
        assert_eq!(answers.len(), 1, "v6 {v6}: affinity broken: {answers:?}");

        // The set replaced by one backend: every new connection goes there,
        // and the old set is gone from the map.
        datapath
            .put_service(
                &tcp_key,
                2,
                &[service_backend(backend_of(&pods[1]))],
                0,
                Outside::No,
            )
            .unwrap();
        for _ in 0..10 {
            let (answer, _) = client(&cgroup.0, &client_pod.netns, "tcp", frontend).unwrap();
            assert_eq!(
                answer, "b1",
                "v6 {v6}: a new connection to a removed backend"
            );
        }
        assert_eq!(
            datapath.service_backends(&tcp_key).unwrap().unwrap().len(),
            1
        );

        // No endpoint: connect() is refused, as kube-proxy's REJECT does.
        datapath
            .put_service(&tcp_key, 3, &[], 0, Outside::No)
            .unwrap();
        let refused = client(&cgroup.0, &client_pod.netns, "tcp", frontend);
        assert_eq!(
            refused.as_ref().err().and_then(|(_, errno)| *errno),
            Some(111),
            "v6 {v6}: {refused:?}"
        );
        datapath.delete_service(&tcp_key).unwrap();

        // UDP, DNS-like: the answer's source is the ClusterIP and port the
        // client sent to (recvmsg rewritten), as a resolver checks.
        let dns = SocketAddr::new(cluster_ip, 53);
        let udp_key = service_key(cluster_ip, 53, UDP);
        datapath
            .put_service(
                &udp_key,
                4,
                &[service_backend(backend_of(&pods[2]))],
                0,
                Outside::No,
            )
            .unwrap();
        let (answer, from) = client(&cgroup.0, &client_pod.netns, "udp", dns)
            .unwrap_or_else(|e| panic!("v6 {v6}: UDP to {dns}: {e:?}"));
        assert_eq!((answer.as_str(), from), ("b2", dns), "v6 {v6}");
        datapath.delete_service(&udp_key).unwrap();
        assert!(datapath.service_frontends().unwrap().is_empty());
    }

    // Hairpin: a Service whose backend is the client pod itself.
    let _itself = Backend::start(&client_pod.netns, "itself");
    let hairpin = SocketAddr::from((Ipv4Addr::new(10, 96, 7, 9), 80));
    let hairpin_key = service_key(hairpin.ip(), 80, TCP);
    datapath
        .put_service(
            &hairpin_key,
            6,
            &[service_backend(SocketAddr::new(
                client_pod.address(false),
                BACKEND_PORT,
            ))],
            0,
            Outside::No,
        )
        .unwrap();
    let (answer, peer) = client(&cgroup.0, &client_pod.netns, "tcp", hairpin).unwrap();
    assert_eq!((answer.as_str(), peer), ("itself", hairpin));
    datapath.delete_service(&hairpin_key).unwrap();

    // Pod to pod straight: untouched.
    let direct = SocketAddr::new(pods[0].address(false), BACKEND_PORT);
    let (answer, peer) = client(&cgroup.0, &client_pod.netns, "tcp", direct).unwrap();
    assert_eq!((answer.as_str(), peer), ("b0", direct));

    datapath.detach_services().unwrap();
    assert!(!datapath.services_attached());
}
