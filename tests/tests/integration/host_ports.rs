//! A Pod's hostPort in BPF (`--host-ports`, `auto` with `--services
//! ebpf`): flatnet's own entry declares `portMappings` instead of chaining
//! portmap, and ADD serves each mapping as a frontend of the Service maps
//! with the pod as its one backend. Reached as portmap's rules reach it:
//! from outside the node (the uplink program; the client's address kept,
//! as portmap's DNAT keeps it), from other pods and from the node itself,
//! on the node's address and on loopback (the socket programs); by
//! `hostIP` and protocol, as the upstream e2e spec "HostPort validates that
//! there is no conflict between pods with same hostPort but different
//! hostIP and protocol" checks. No iptables or nftables rule is made.

use std::net::{Ipv4Addr, SocketAddr};

use flatnet_common::{FRONTEND_F_HOST_PORT, external_port};
use flatnet_datapath::bpf::service_key;
use flatnet_datapath::netlink::AttachmentNames;
use flatnet_tests::cgroup::TestCgroup;
use flatnet_tests::cluster::*;
use flatnet_tests::kube_stub::{ApiStub, Kind};
use flatnet_tests::*;
use serde_json::json;

use crate::nodeport::exchanges::{Echo, tcp_ask, udp_ask};
use crate::nodeport::fixture::{OUTSIDE, two_nodes_and_outside, two_nodes_and_outside_flagged};
use crate::socket_lb::api::{BACKEND_PORT, api_service};
use crate::socket_lb::fixture::{Seen, client};

const WEB_PORT: u16 = 30500;
const SHARED_PORT: u16 = 30600;
const SERVICE_PORT: u16 = 30700;

/// The hostPort frontends of `port` in `node`'s maps, as (address,
/// protocol).
fn host_port_frontends(node: &SimNode, port: u16) -> Vec<(std::net::IpAddr, u8)> {
    node.datapath()
        .service_frontends()
        .unwrap()
        .into_iter()
        .filter(|(_, value)| value.flags & FRONTEND_F_HOST_PORT != 0)
        .map(|(key, _)| flatnet_datapath::bpf::frontend_of(&key))
        .filter(|(_, number, _)| *number == port)
        .map(|(address, _, protocol)| (address, protocol))
        .collect()
}

/// `port`'s `EXTERNAL_PORTS` bits written for hostPorts.
fn host_port_bits(node: &SimNode, port: u16) -> u32 {
    node.datapath()
        .external_port_bits()
        .unwrap()
        .into_iter()
        .find(|(number, _)| *number == port)
        .map_or(0, |(_, bits)| bits >> external_port::HOST_PORT_SHIFT)
}

fn answer_of(seen: Seen, what: &str) -> (String, SocketAddr) {
    seen.unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

#[flatnet_test(root)]
fn host_ports_are_served_in_bpf_from_outside_pods_and_the_node() {
    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let (cluster, served) = two_nodes_and_outside(&cgroup, &stub);
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let outside = &cluster._switch;
    // flatnet takes portmap's capability; portmap is not chained.
    let conflist = cp.conflist();
    assert_eq!(
        conflist["plugins"][0]["capabilities"]["portMappings"], true,
        "{conflist}"
    );
    assert!(!conflist.to_string().contains("\"portmap\""), "{conflist}");

    let web = cp.pod_with_host_ports(json!([
        {"hostPort": WEB_PORT, "containerPort": BACKEND_PORT, "protocol": "tcp"},
        {"hostPort": WEB_PORT, "containerPort": BACKEND_PORT, "protocol": "UDP", "hostIP": ""},
    ]));
    let _web_server = Echo::start(&web.netns, "web");
    let loopback = Ipv4Addr::LOCALHOST.into();
    let wildcard = Ipv4Addr::UNSPECIFIED.into();
    let mut frontends = host_port_frontends(cp, WEB_PORT);
    frontends.sort();
    assert_eq!(
        frontends,
        [(wildcard, 6), (wildcard, 17), (loopback, 6), (loopback, 17)]
    );
    assert_eq!(
        host_port_bits(cp, WEB_PORT),
        external_port::NODEPORT_TCP
            | external_port::NODEPORT_UDP
            | external_port::ADDRESS_TCP
            | external_port::ADDRESS_UDP
    );
    // And on ANY_PORT, which `from_pod` reads before asking the reply path.
    assert_eq!(
        host_port_bits(cp, external_port::ANY_PORT),
        host_port_bits(cp, WEB_PORT)
    );
    let on_node = SocketAddr::from((cp.spec.address(), WEB_PORT));

    // From outside: the uplink program, the client's address kept, the
    // UDP answer from the hostPort.
    assert_eq!(tcp_ask(outside, on_node).unwrap(), format!("web {OUTSIDE}"));
    assert_eq!(
        udp_ask(outside, on_node).unwrap(),
        (format!("web {OUTSIDE}"), on_node)
    );
    // From a pod on the other node: its own address seen, the socket's
    // peer the hostPort.
    let client_pod = worker.pod();
    for protocol in ["tcp", "udp"] {
        assert_eq!(
            answer_of(
                client(&cgroup.0, &client_pod.netns, protocol, on_node),
                protocol
            ),
            (format!("web {}", client_pod.ip), on_node),
            "{protocol} from a pod"
        );
    }
    // From the node itself, on its address and on loopback.
    for to in [on_node, SocketAddr::from((Ipv4Addr::LOCALHOST, WEB_PORT))] {
        let (answer, peer) = answer_of(client(&cgroup.0, &cp.netns, "tcp", to), "node");
        assert!(answer.starts_with("web "), "{to}: {answer}");
        assert_eq!(peer, to);
    }
    // `flatnet inspect --services` names the pod behind each.
    let web_veth = AttachmentNames::new(&cp.network, &web.container, "eth0").host_veth;
    let out = std::process::Command::new(bin("flatnet"))
        .args(["inspect", "--services", "--json", "--network", &cp.network])
        .env("FLATNET_PIN_ROOT", &cp.pin_root)
        .output()
        .expect("flatnet inspect --services");
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let of_web = report[0]["frontends"]
        .as_array()
        .expect("frontends")
        .iter()
        .filter(|f| f["host_port_of"] == web_veth.as_str())
        .count();
    assert_eq!(of_web, 4, "{report}");
    // Nothing of portmap's in the node's netfilter rules.
    let rules = format!(
        "{}{}",
        cp.netns.exec(&["iptables-save"]),
        cp.netns.exec(&["nft", "list", "ruleset"])
    );
    assert!(
        !rules.contains("HOSTPORT") && !rules.contains(&WEB_PORT.to_string()),
        "{rules}"
    );

    // The e2e spec's three pods: one hostPort, told apart by hostIP and
    // protocol.
    let node_ip = cp.spec.address().to_string();
    // As containerd 1.6 passes them (go-cni's struct, no JSON names).
    let by_host_ip = |protocol: &str, host_ip: &str| {
        cp.pod_with_host_ports(json!([{"HostPort": SHARED_PORT,
            "ContainerPort": BACKEND_PORT, "Protocol": protocol, "HostIP": host_ip}]))
    };
    let pods = [
        by_host_ip("tcp", "127.0.0.1"),
        by_host_ip("tcp", &node_ip),
        by_host_ip("udp", &node_ip),
    ];
    let _servers: Vec<Echo> = pods
        .iter()
        .zip(["one", "two", "three"])
        .map(|(pod, name)| Echo::start(&pod.netns, name))
        .collect();
    let shared = SocketAddr::from((cp.spec.address(), SHARED_PORT));
    let shared_loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, SHARED_PORT));
    for (protocol, to, name) in [
        ("tcp", shared_loopback, "one"),
        ("tcp", shared, "two"),
        ("udp", shared, "three"),
    ] {
        let (answer, _) = answer_of(client(&cgroup.0, &cp.netns, protocol, to), "node");
        assert!(
            answer.starts_with(&format!("{name} ")),
            "{protocol} {to}: {answer}"
        );
    }
    assert_eq!(tcp_ask(outside, shared).unwrap(), format!("two {OUTSIDE}"));
    assert_eq!(
        udp_ask(outside, shared).unwrap(),
        (format!("three {OUTSIDE}"), shared)
    );

    // Taken: a fourth pod asking for the port on every address is refused
    // with the holder named, and leaves the node as it was.
    let records = cp.datapath().host_ports();
    let refused_netns = Netns::new();
    let (container, out) = cp.add(
        &refused_netns,
        "",
        Some(json!([{"hostPort": SHARED_PORT, "containerPort": BACKEND_PORT}])),
    );
    out.assert_error(7, "is held by the pod behind");
    let names = AttachmentNames::new(&cp.network, &container, "eth0");
    assert!(!cp.has_link(&names.host_veth), "{} left", names.host_veth);
    assert_eq!(cp.datapath().host_ports(), records);
    assert_eq!(tcp_ask(outside, shared).unwrap(), format!("two {OUTSIDE}"));

    // A Service's NodePort and a hostPort on the same port: the one there
    // first stays, the other is refused (ADD) or not written (the agent).
    let mut service = api_service("np", Ipv4Addr::new(10, 96, 9, 40));
    service["spec"]["type"] = "NodePort".into();
    service["spec"]["ports"][0]["nodePort"] = SERVICE_PORT.into();
    stub.add(Kind::Service, service);
    wait_until("cp-1's agent to write the NodePort", SETTLE, || {
        cp.datapath()
            .service_frontends()
            .unwrap()
            .iter()
            .any(|(key, _)| *key == service_key(wildcard, SERVICE_PORT, 6))
    });
    let (_, out) = cp.add(
        &Netns::new(),
        "",
        Some(json!([{"hostPort": SERVICE_PORT, "containerPort": BACKEND_PORT}])),
    );
    out.assert_error(7, "is a Service's frontend");
    let mut on_web = api_service("on-web", Ipv4Addr::new(10, 96, 9, 41));
    on_web["spec"]["type"] = "NodePort".into();
    on_web["spec"]["ports"][0]["nodePort"] = WEB_PORT.into();
    stub.add(Kind::Service, on_web);
    wait_until("cp-1's agent to meet the hostPort", SETTLE, || {
        cp.agent_log().contains("is a Pod's hostPort on this node")
    });
    assert_eq!(tcp_ask(outside, on_node).unwrap(), format!("web {OUTSIDE}"));

    // The agent's restart leaves hostPorts alone (they are not its own).
    cp.stop_agent();
    cp.start_agent(&Peers::Api(served[0].url.clone()));
    cp.wait_ready();
    assert_eq!(host_port_frontends(cp, WEB_PORT).len(), 4);
    assert_eq!(tcp_ask(outside, on_node).unwrap(), format!("web {OUTSIDE}"));

    stub.delete(Kind::Service, "default/on-web");

    // DEL takes the hostPorts away: refused from outside, no frontend, no
    // bit, no record.
    drop(web);
    assert_eq!(host_port_frontends(cp, WEB_PORT), []);
    assert_eq!(host_port_bits(cp, WEB_PORT), 0);
    assert!(!cp.datapath().host_ports().contains_key(&web_veth));
    let refused = tcp_ask(outside, on_node);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    drop(pods);
    assert!(cp.datapath().host_ports().is_empty());
    assert_eq!(host_port_bits(cp, SHARED_PORT), 0);
    assert_eq!(host_port_bits(cp, external_port::ANY_PORT), 0);
}

/// What clients get from a pod's hostPort (TCP and UDP, `WEB_PORT` on
/// cp-1, the pod an `Echo` named "web"): by (client, protocol), the source
/// the pod saw, written as what it is ("client", "node", "gateway",
/// "itself", "pod" for the other node's pod, else the address), or the
/// error; and whether each UDP answer came from the hostPort.
type HostPortOutcome = std::collections::BTreeMap<(&'static str, &'static str), String>;

fn host_port_outcome(
    cluster: &Cluster,
    web: &SimPod,
    cgroup: &std::path::Path,
    plain: &std::path::Path,
) -> HostPortOutcome {
    let (cp, worker) = (cluster.node("cp-1"), cluster.node("worker-1"));
    let on_node = SocketAddr::from((cp.spec.address(), WEB_PORT));
    let other_pod = worker.pod();
    let what = |source: &str| -> String {
        let Ok(source) = source.parse::<Ipv4Addr>() else {
            return source.to_string();
        };
        if source == OUTSIDE {
            "client".into()
        } else if source == cp.spec.address() {
            "node".into()
        } else if source == worker.spec.address() {
            "other node".into()
        } else if source == web.ip {
            "itself".into()
        } else if source == other_pod.ip {
            "pod".into()
        } else if source.octets()[3] == 1 {
            "gateway".into()
        } else {
            source.to_string()
        }
    };
    let seen = |answer: &str| -> String {
        match answer.strip_prefix("web ") {
            Some(source) => what(source),
            None => format!("answered {answer:?}"),
        }
    };
    let mut outcome = HostPortOutcome::new();
    let outside = &cluster._switch;
    outcome.insert(
        ("outside", "tcp"),
        tcp_ask(outside, on_node).map_or_else(|e| e.to_string(), |answer| seen(&answer)),
    );
    outcome.insert(
        ("outside", "udp"),
        udp_ask(outside, on_node).map_or_else(
            |e| e.to_string(),
            |(answer, from)| format!("{} from {}", seen(&answer), from == on_node),
        ),
    );
    // The other node's own client runs outside the cgroup the simulated
    // nodes' socket programs share, as a real node's processes are outside
    // any other node's: its flow crosses the wire to cp-1's hostPort.
    for (name, netns, cgroup) in [
        ("another node's pod", &other_pod.netns, cgroup),
        ("another node", &worker.netns, plain),
        ("the node", &cp.netns, cgroup),
        ("the pod itself", &web.netns, cgroup),
    ] {
        for protocol in ["tcp", "udp"] {
            let key = (name, protocol);
            let value = match client(cgroup, netns, protocol, on_node) {
                Ok((answer, peer)) => format!("{} from {}", seen(&answer), peer == on_node),
                Err(e) => format!("{e:?}"),
            };
            outcome.insert(key, value);
        }
    }
    outcome
}

/// The fast path invisible for hostPorts: the same clients reach a pod's
/// hostPort (TCP and UDP) through a cluster whose hostPorts are flatnet's
/// (in BPF, kube-proxy and portmap absent) and through one where the
/// reference portmap plugin, chained after flatnet as a runtime chains it
/// (snat on), serves it with its iptables rules: from outside the node,
/// from a pod on the other node, from the other node itself (its address
/// kept: the pod's reply must be translated back before anything routes it
/// to that node), from the node itself and from the pod itself (hairpin),
/// on the node's address. What each gets, the source
/// the pod saw and where UDP answers came from, is compared whole, but for
/// the hairpin's source, asserted as it differs. The node's TCP and UDP
/// are seen from the node's address on both (the socket programs bind a
/// connect() there and set a sendmsg()'s source, as the kernel picks it
/// for a local destination). Both clusters in each datapath mode (in XDP
/// mode the pod's replies to an outside client are translated at tc
/// ingress of its host veth, after `from_pod_xdp` passed them).
#[flatnet_test(root, cases(tc("tc"), xdp("xdp")))]
fn host_ports_answer_as_portmaps_rules_do(datapath: &str) {
    use crate::services::node_and_host_ports::PortMapping;

    let cgroup = TestCgroup::new("flatnet-test-").expect("the test's cgroup");
    let stub = ApiStub::from_fixture();
    let mode_flags = ["--datapath", datapath];
    let (flatnet, _served) = two_nodes_and_outside_flagged(&cgroup, &stub, &mode_flags);
    let portmap = Cluster::started(
        &specs(&[
            ("cp-1", 1, Some("10.244.0.0/24")),
            ("worker-1", 2, Some("10.244.1.0/24")),
        ]),
        &mode_flags,
    );
    for cluster in [&flatnet, &portmap] {
        let conflist = cluster.node("cp-1").conflist();
        assert_eq!(conflist["plugins"][0]["datapath"], datapath);
    }
    portmap
        ._switch
        .exec(&["ip", "addr", "add", &format!("{OUTSIDE}/24"), "dev", "br0"]);
    // No socket programs in this one: the portmap cluster's clients.
    let plain = TestCgroup::new("flatnet-test-").expect("a second cgroup");

    let web_bpf = flatnet.node("cp-1").pod_with_host_ports(json!([
        {"hostPort": WEB_PORT, "containerPort": BACKEND_PORT, "protocol": "TCP"},
        {"hostPort": WEB_PORT, "containerPort": BACKEND_PORT, "protocol": "UDP"},
    ]));
    let web_portmap = portmap.node("cp-1").pod();
    let _mapping = PortMapping::add(&web_portmap, WEB_PORT, BACKEND_PORT, &["tcp", "udp"]);
    let _servers = [
        Echo::start(&web_bpf.netns, "web"),
        Echo::start(&web_portmap.netns, "web"),
    ];

    let mut through_bpf = host_port_outcome(&flatnet, &web_bpf, &cgroup.0, &plain.0);
    let mut through_portmap = host_port_outcome(&portmap, &web_portmap, &plain.0, &plain.0);
    // Where the socket programs show the pod another source than
    // portmap's rules (README: hostPort), asserted as they are so that a
    // change shows: the pod reaching its own hostPort is connected to
    // itself (portmap's hairpin masquerades it to the node's address). It
    // still answers, from the hostPort.
    for (key, from_bpf) in [
        (("the pod itself", "tcp"), "itself from true"),
        (("the pod itself", "udp"), "itself from true"),
    ] {
        assert_eq!(
            through_bpf.remove(&key).as_deref(),
            Some(from_bpf),
            "{key:?}"
        );
        assert_eq!(
            through_portmap.remove(&key).as_deref(),
            Some("node from true"),
            "{key:?}"
        );
    }
    assert_eq!(through_bpf, through_portmap);
}
