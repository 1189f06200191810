//! The fast path invisible for the node's own ClusterIP clients: they get
//! the same backends and sources from flatnet's socket programs as from
//! kube-proxy's rules.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use flatnet_datapath::bpf::service_key;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::*;

use super::api::{BACKEND_PORT, add_udp_twin, api_service, api_slice};
use super::fixture::{TCP, UDP, client};

/// What the node's and a pod's clients of a ClusterIP get (TCP and UDP), by
/// (client, Service, protocol): the backend that answered and the source
/// it saw, written as what it is ("node", "gateway", "client pod", else
/// the address), or the error.
type ClusterIpOutcome =
    std::collections::BTreeMap<(&'static str, &'static str, &'static str), String>;

/// The fast path invisible for the node's own ClusterIP clients: the node
/// (and a pod beside it) reach a Service whose one backend is on the same
/// node and one whose backend is on the other node, TCP and UDP, through a
/// cluster whose Services are flatnet's socket programs (kube-proxy
/// absent) and through one where kube-proxy's iptables rules (the
/// fixture, `--cluster-cidr` set, so the node's flows are masqueraded)
/// serve them; the backends see the same sources on both.
#[flatnet_test(root)]
fn cluster_ips_from_the_node_answer_as_kube_proxys_rules_do() {
    use flatnet_tests::cluster::{Cluster, SETTLE, specs};
    use flatnet_tests::kube_proxy::{Mode, Protocol, ServicePort};
    use flatnet_tests::kube_stub::{ApiStub, Kind};

    const TO_LOCAL: Ipv4Addr = Ipv4Addr::new(10, 96, 9, 60);
    const TO_REMOTE: Ipv4Addr = Ipv4Addr::new(10, 96, 9, 61);
    let nodes = [
        ("cp-1", 1, Some("10.244.0.0/24")),
        ("worker-1", 2, Some("10.244.1.0/24")),
    ];
    // Each node's socket programs on a cgroup of its own, as on real
    // nodes: cp-1's clients meet cp-1's programs only (on one shared
    // cgroup, whichever node's program ran first would rewrite them).
    let cgroup = TestCgroup::new("flatnet-test-").expect("cp-1's cgroup");
    let worker_cgroup = TestCgroup::new("flatnet-test-").expect("worker-1's cgroup");
    let stub = ApiStub::from_fixture();
    let mut flatnet = Cluster::new(&specs(&nodes));
    for (node, node_cgroup) in flatnet.nodes.iter_mut().zip([&cgroup, &worker_cgroup]) {
        node.agent_flags = vec![
            "--services".into(),
            "ebpf".into(),
            "--services-cgroup".into(),
            node_cgroup.0.display().to_string(),
        ];
    }
    let _served = flatnet.start_agents_on_api(&stub);
    let kube_proxy = Cluster::started(&specs(&nodes), &[]);
    // No socket programs here: the kube-proxy cluster's clients.
    let plain = TestCgroup::new("flatnet-test-").expect("a second cgroup");

    let outcome = |cluster: &Cluster, cgroup: &Path, serve: &dyn Fn(Ipv4Addr, Ipv4Addr)| {
        let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
        // A node has a default route (kube-proxy's DNAT comes after the
        // route lookup for the ClusterIP): here toward the switch, inside
        // the simulation; nothing takes it after translation.
        cp.netns
            .exec(&["ip", "route", "add", "default", "via", "172.30.0.100"]);
        let (local, remote, client_pod) = (cp.pod(), worker.pod(), cp.pod());
        let _servers = [
            crate::nodeport::exchanges::Echo::start(&local.netns, "local"),
            crate::nodeport::exchanges::Echo::start(&remote.netns, "remote"),
        ];
        serve(local.ip, remote.ip);
        let what = |source: &str| -> String {
            match source.parse::<Ipv4Addr>() {
                Ok(ip) if ip == cp.spec.address() => "node".into(),
                Ok(ip) if ip == client_pod.ip => "client pod".into(),
                Ok(ip) if ip.octets()[3] == 1 => "gateway".into(),
                _ => source.to_string(),
            }
        };
        let mut outcome = ClusterIpOutcome::new();
        for (client_name, netns) in [("node", &cp.netns), ("pod", &client_pod.netns)] {
            for (service, ip) in [("to-local", TO_LOCAL), ("to-remote", TO_REMOTE)] {
                for (protocol, port) in [("tcp", 80), ("udp", 53)] {
                    let to = SocketAddr::from((ip, port));
                    let seen = match client(cgroup, netns, protocol, to) {
                        Ok((answer, peer)) => {
                            let (name, source) = answer.split_once(' ').unwrap_or((&answer, ""));
                            format!("{name} saw {} (from {})", what(source), peer == to)
                        }
                        Err(e) => format!("{e:?}"),
                    };
                    outcome.insert((client_name, service, protocol), seen);
                }
            }
        }
        outcome
    };

    let through_flatnet = outcome(&flatnet, &cgroup.0, &|local, remote| {
        for (name, ip, backend, node) in [
            ("to-local", TO_LOCAL, local, "cp-1"),
            ("to-remote", TO_REMOTE, remote, "worker-1"),
        ] {
            let mut service = api_service(name, ip);
            add_udp_twin(&mut service);
            service["spec"]["ports"][1]["port"] = 53.into();
            stub.add(Kind::Service, service);
            let mut slice = api_slice(name, &[(backend, node)]);
            slice["ports"]
                .as_array_mut()
                .expect("ports")
                .push(serde_json::json!({"name": "dns", "port": BACKEND_PORT, "protocol": "UDP"}));
            stub.add(Kind::EndpointSlice, slice);
        }
        let cp = flatnet.node("cp-1");
        wait_until("cp-1's agent to write its own source", SETTLE, || {
            cp.datapath().node_sources().unwrap() == [IpAddr::V4(cp.spec.address())]
        });
        wait_until("cp-1's agent to serve both Services", SETTLE, || {
            [TO_LOCAL, TO_REMOTE].iter().all(|ip| {
                [(80, TCP), (53, UDP)].iter().all(|(port, protocol)| {
                    cp.datapath()
                        .service_backends(&service_key((*ip).into(), *port, *protocol))
                        .unwrap()
                        .is_some_and(|set| set.len() == 1)
                })
            })
        });
    });
    let through_kube_proxy = outcome(&kube_proxy, &plain.0, &|local, remote| {
        let mut ports = Vec::new();
        for (name, ip, backend) in [
            ("to-local", TO_LOCAL, local),
            ("to-remote", TO_REMOTE, remote),
        ] {
            let backends = vec![SocketAddr::from((backend, BACKEND_PORT))];
            ports.push(ServicePort::cluster_ip(
                name,
                ip.into(),
                80,
                Protocol::Tcp,
                backends.clone(),
            ));
            ports.push(ServicePort::cluster_ip(
                name,
                ip.into(),
                53,
                Protocol::Udp,
                backends,
            ));
        }
        kube_proxy.program_kube_proxy(Mode::Iptables, &ports);
    });
    assert_eq!(through_flatnet, through_kube_proxy);
    assert_eq!(
        through_flatnet[&("pod", "to-local", "tcp")],
        "local saw client pod (from true)"
    );
}
