//! Agents with `--services ebpf` keep the Service maps from the API: a
//! client follows endpoint changes, and the sockets to a backend that
//! leaves its Service are destroyed.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use flatnet_datapath::bpf::service_key;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::*;
use serde_json::Value;

use super::api::{BACKEND_PORT, api_service, api_slice, ebpf_services_cluster};
use super::fixture::{
    Backend, Resolver, TCP, UDP, blackhole_services, client, live_answer, live_client,
};

/// `--services ebpf`: two simulated nodes whose agents follow the API
/// stub's Services and EndpointSlices and attach the socket programs to the
/// test's cgroup. A client pod on cp-1 reaches a Service whose backends are
/// a pod on each node (named target port), follows an endpoint change, and
/// is refused once the Service has no endpoint.
#[flatnet_test(root)]
fn the_agent_keeps_the_service_maps_from_the_api() {
    use flatnet_tests::cluster::*;
    use flatnet_tests::kube_stub::{ApiStub, Kind};
    use std::time::Instant;

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, served) = ebpf_services_cluster(
        &[
            ("cp-1", 1, Some("10.244.0.0/24")),
            ("worker-1", 2, Some("10.244.1.0/24")),
        ],
        &cgroup,
        &stub,
    );
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let client_pod = cp.pod();
    blackhole_services(&client_pod.netns);
    let (local, remote) = (cp.pod(), worker.pod());
    let _servers = [
        Backend::start(&local.netns, "local"),
        Backend::start(&remote.netns, "remote"),
    ];
    let cluster_ip = Ipv4Addr::new(10, 96, 9, 1);
    let frontend = SocketAddr::from((cluster_ip, 80));
    let key = service_key(cluster_ip.into(), 80, TCP);
    let backends_on_cp = || {
        cp.datapath()
            .service_backends(&key)
            .unwrap()
            .map(|b| b.len())
    };

    stub.add(Kind::Service, api_service("web", cluster_ip));
    let changed = Instant::now();
    stub.add(
        Kind::EndpointSlice,
        api_slice("web", &[(local.ip, "cp-1"), (remote.ip, "worker-1")]),
    );
    wait_until("cp-1's agent to write web's two backends", SETTLE, || {
        backends_on_cp() == Some(2)
    });
    eprintln!("EndpointSlice to maps: {:?}", changed.elapsed());
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let (answer, peer) = client(&cgroup.0, &client_pod.netns, "tcp", frontend)
            .unwrap_or_else(|e| panic!("connect to {frontend}: {e:?}"));
        assert_eq!(peer, frontend);
        seen.insert(answer);
    }
    assert_eq!(
        seen,
        BTreeSet::from(["local".to_string(), "remote".to_string()])
    );

    // kube-proxy's iptables rules for the same Service, on both nodes, but
    // naming the local backend only: no packet is addressed to the
    // ClusterIP any more, so they change nothing.
    let mut port = kube_proxy_fixture::ServicePort::cluster_ip(
        "web",
        cluster_ip.into(),
        80,
        kube_proxy_fixture::Protocol::Tcp,
        vec![SocketAddr::from((local.ip, BACKEND_PORT))],
    );
    port.port_name = "http".into();
    cluster.program_kube_proxy(kube_proxy_fixture::Mode::Iptables, &[port]);
    let with_rules: BTreeSet<String> = (0..20)
        .map(|_| {
            client(&cgroup.0, &client_pod.netns, "tcp", frontend)
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(
        with_rules,
        BTreeSet::from(["local".to_string(), "remote".to_string()]),
        "kube-proxy's rules changed where connections went"
    );

    // The agent restarted under a live connection through the ClusterIP:
    // its bytes keep flowing (one every 100 ms for 3.6 s) and it ends
    // normally, no reset.
    let live = live_client(
        &cgroup.0,
        &client_pod.netns,
        frontend,
        "a-live-connection-across-the-restart",
    );
    // Fixed on purpose: the connection carries data for a while before the
    // restart, so a reset at the restart is not mistaken for a slow start.
    std::thread::sleep(Duration::from_millis(300));
    cp.stop_agent();
    cp.start_agent(&Peers::Api(served[0].url.clone()));
    cp.wait_ready();
    let line = live_answer(live);
    assert!(
        matches!(line["answer"].as_str(), Some("local" | "remote")),
        "the live connection across the agent's restart: {line}"
    );
    assert_eq!(
        backends_on_cp(),
        Some(2),
        "the restarted agent lost the maps"
    );

    // The local backend leaves: new connections go to the remote one only.
    stub.modify(Kind::EndpointSlice, "default/web-1", |slice| {
        *slice = api_slice("web", &[(remote.ip, "worker-1")]);
    });
    wait_until("the local backend gone from cp-1's maps", SETTLE, || {
        backends_on_cp() == Some(1)
    });
    for _ in 0..10 {
        let (answer, _) = client(&cgroup.0, &client_pod.netns, "tcp", frontend).unwrap();
        assert_eq!(answer, "remote");
    }
    // A live connection to the remaining backend while the set changes
    // twice (the local backend back, then gone again): untouched.
    let live = live_client(
        &cgroup.0,
        &client_pod.netns,
        frontend,
        "a-live-connection-to-remote",
    );
    // Fixed on purpose, as above: data flows before the change under test.
    std::thread::sleep(Duration::from_millis(300));
    stub.modify(Kind::EndpointSlice, "default/web-1", |slice| {
        *slice = api_slice("web", &[(local.ip, "cp-1"), (remote.ip, "worker-1")]);
    });
    wait_until("the local backend back on cp-1", SETTLE, || {
        backends_on_cp() == Some(2)
    });
    stub.modify(Kind::EndpointSlice, "default/web-1", |slice| {
        *slice = api_slice("web", &[(remote.ip, "worker-1")]);
    });
    wait_until("the local backend gone again", SETTLE, || {
        backends_on_cp() == Some(1)
    });
    let line = live_answer(live);
    assert_eq!(line["answer"], "remote", "the live connection: {line}");

    // No endpoint left: refused.
    stub.modify(Kind::EndpointSlice, "default/web-1", |slice| {
        *slice = api_slice("web", &[]);
    });
    wait_until("web without backends on cp-1", SETTLE, || {
        backends_on_cp() == Some(0)
    });
    let refused = client(&cgroup.0, &client_pod.netns, "tcp", frontend);
    assert_eq!(refused.err().and_then(|(_, errno)| errno), Some(111));
    // The Service deleted: its frontend goes.
    stub.delete(Kind::Service, "default/web");
    wait_until("web gone from cp-1's maps", SETTLE, || {
        backends_on_cp().is_none()
    });
    let page = cp.metrics();
    assert!(page.contains("flatnet_services 0"), "{page}");
    for node in &cluster.nodes {
        node.stop_agent();
        // What the agent attached to the cgroup goes with the network.
        node.datapath().detach_services().unwrap();
    }
}

/// `--services ebpf`: a backend that leaves its Service takes the local
/// clients' sockets to it along. A DNS-like client holds one connected UDP
/// socket to a ClusterIP (as nginx's resolver does) and a TCP connection
/// runs through the same Service; its only backend is then replaced by
/// another while the old pod still answers (a pod being deleted serves
/// until it is gone). Both sockets are destroyed: the resolver's next call
/// fails (ECONNABORTED or EDESTADDRREQ), its new socket reaches the new
/// backend, and the
/// TCP connection ends with an error. A socket connected to the old pod's
/// own address is not the Service's and keeps working.
#[flatnet_test(root)]
fn sockets_to_a_departed_backend_are_destroyed() {
    use flatnet_tests::cluster::*;
    use flatnet_tests::kube_stub::{ApiStub, Kind};
    use std::time::Instant;

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, _served) =
        ebpf_services_cluster(&[("cp-1", 1, Some("10.244.0.0/24"))], &cgroup, &stub);
    let cp = cluster.node("cp-1");
    let client_pod = cp.pod();
    blackhole_services(&client_pod.netns);
    let (old, new) = (cp.pod(), cp.pod());
    let _servers = [
        Backend::start(&old.netns, "old"),
        Backend::start(&new.netns, "new"),
    ];
    let cluster_ip = Ipv4Addr::new(10, 96, 9, 53);
    let slice = |endpoint: Ipv4Addr| {
        serde_json::json!({
            "metadata": {"namespace": "default", "name": "dns-1",
                         "labels": {"kubernetes.io/service-name": "dns"}},
            "addressType": "IPv4",
            "ports": [{"name": "dns", "port": BACKEND_PORT, "protocol": "UDP"},
                      {"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
            "endpoints": [{"addresses": [endpoint.to_string()], "nodeName": "cp-1",
                           "conditions": {"ready": true}}]
        })
    };
    stub.add(
        Kind::Service,
        serde_json::json!({
            "metadata": {"namespace": "default", "name": "dns"},
            "spec": {"type": "ClusterIP", "clusterIP": cluster_ip.to_string(),
                     "clusterIPs": [cluster_ip.to_string()],
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
                               {"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]}
        }),
    );
    stub.add(Kind::EndpointSlice, slice(old.ip));
    let udp_key = service_key(cluster_ip.into(), 53, UDP);
    let backend_on_cp = || {
        cp.datapath()
            .service_backends(&udp_key)
            .unwrap()
            .and_then(|set| set.first().map(flatnet_datapath::bpf::backend_address))
    };
    wait_until("the old backend in cp-1's maps", SETTLE, || {
        backend_on_cp() == Some(SocketAddr::from((old.ip, BACKEND_PORT)))
    });

    let resolver = Resolver::start(
        &cgroup.0,
        &client_pod.netns,
        SocketAddr::from((cluster_ip, 53)),
        8,
    );
    let direct = Resolver::start(
        &cgroup.0,
        &client_pod.netns,
        SocketAddr::from((old.ip, BACKEND_PORT)),
        8,
    );
    let tcp = live_client(
        &cgroup.0,
        &client_pod.netns,
        SocketAddr::from((cluster_ip, 80)),
        "a-connection-through-the-service-to-the-old-backend",
    );
    wait_until(
        "the resolver's answers from the old backend",
        SETTLE,
        || resolver.answers().len() >= 3 && direct.answers().len() >= 3,
    );
    assert!(
        resolver.answers().iter().all(|a| a == "old"),
        "{:?}",
        resolver.answers()
    );

    let changed = Instant::now();
    stub.modify(Kind::EndpointSlice, "default/dns-1", |s| {
        *s = slice(new.ip);
    });
    wait_until("the new backend in cp-1's maps", SETTLE, || {
        backend_on_cp() == Some(SocketAddr::from((new.ip, BACKEND_PORT)))
    });
    wait_until(
        "the resolver's answers from the new backend",
        SETTLE,
        || resolver.answers().last().map(String::as_str) == Some("new"),
    );
    eprintln!(
        "EndpointSlice change to the resolver's first answer from the new backend: {:?}",
        changed.elapsed()
    );

    let lines = resolver.finish();
    let events: Vec<&Value> = lines
        .iter()
        .filter(|(at, _)| *at >= changed)
        .map(|(_, line)| line)
        .collect();
    // ECONNABORTED when the call was waiting on the socket as it was
    // destroyed; EDESTADDRREQ when it came after (the kernel disconnects a
    // destroyed UDP socket).
    let aborted = events
        .iter()
        .position(|line| {
            [libc::ECONNABORTED, libc::EDESTADDRREQ]
                .map(i64::from)
                .contains(&line["errno"].as_i64().unwrap_or_default())
        })
        .unwrap_or_else(|| panic!("the resolver's socket was never destroyed: {events:?}"));
    assert!(
        events[aborted + 1..]
            .iter()
            .all(|line| line["answer"] == "new" || line.get("timeout").is_some()),
        "after its socket was destroyed the resolver reached only the new backend: {events:?}"
    );
    let tcp = live_answer(tcp);
    assert!(
        tcp["answer"].is_null() && tcp["errno"].is_i64(),
        "the TCP connection to the old backend went on: {tcp}"
    );
    let direct = direct.finish();
    assert!(
        direct
            .iter()
            .all(|(_, line)| line["answer"] == "old" || line.get("timeout").is_some()),
        "a socket connected to the pod's own address was touched: {direct:?}"
    );
    // Counted on the departures thread, right after the search.
    let counted = "flatnet_service_sockets_destroyed_total 2";
    wait_until("both destroyed sockets counted", SETTLE, || {
        cp.metrics().contains(counted)
    });
    let page = cp.metrics();
    assert!(
        page.contains(counted),
        "the resolver's socket and the TCP connection, nothing else: {page}"
    );
    // How long the search took, for the record.
    for line in cp.agent_log().lines() {
        if line.contains("searched for sockets") {
            eprintln!("{line}");
        }
    }
    cluster.nodes[0].stop_agent();
    cluster.nodes[0].datapath().detach_services().unwrap();
}
